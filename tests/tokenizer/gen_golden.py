#!/usr/bin/env python3
"""gen_golden.py: writes tests/tokenizer/golden.jsonl, the expected output of
torchtune's own Llama 4 tokenizer, which tests/test_tokenizer.c checks the C
tokenizer (runtime/data/tokenizer.c) against, exactly.

    .venv/bin/python tests/tokenizer/gen_golden.py TORCHTUNE_SRC MODEL OUT

TORCHTUNE_SRC is a directory holding torchtune's source package, e.g.
    git -C TORCHTUNE_CLONE archive HEAD torchtune | tar -x -C /tmp/tt   (a clone of github.com/pytorch/torchtune)
    .venv/bin/python tests/tokenizer/gen_golden.py /tmp/tt \
        tests/tokenizer/tiktoken_small_llama4.model tests/tokenizer/golden.jsonl
It needs torch and tiktoken (both in the venv).

The import workaround: `import torchtune` runs torchtune/__init__.py, which
refuses to load without torchao and then imports the whole library (models,
datasets, omegaconf, torchvision, PIL, sentencepiece, HF tokenizers). None of
that is on the tokenizer's path, so this script registers empty package
modules for torchtune, torchtune.data, torchtune.modules, ... (their
__init__.py files never run) and then imports only the real files the text
path uses: torchtune/models/llama4/_tokenizer.py and _transform.py,
torchtune/modules/transforms/tokenizers/_tiktoken.py and _utils.py,
torchtune/data/_messages.py and _utils.py (truncate), and
torchtune/modules/transforms/_transforms.py. What is stubbed is only what
those files import and the text path never calls: torchvision (its v2
transforms), PIL, datasets, torchtune.models.clip's CLIPImageTransform and
torchtune.data._prompt_templates (prompt_template is None here). The
tokenization code that runs is torchtune's, unmodified.

Each output line is one JSON object with a "kind":
  meta      the pattern string, vocab sizes, and every special token and id
  encode    text; ids with bos and eos, ids without; the decode of the
            former under each (truncate_at_eos, skip_special_tokens): keys
            decode_{t,f}{s,k} (t: truncate, s: skip, k: keep specials)
  encode_long  a text too long to store, as [piece, repeat] segments; the
            count, FNV-1a hash, head and tail of its ids, and whether the
            default decode gives the text back
  decode    ids (not from an encode); their decode under each flag pair,
            null where torchtune raises (an id not in the vocabulary)
  chat      messages (role, content, masked, eot) after mask_messages with a
            masking strategy; max_seq_len; add_end_tokens; tokens and mask
            from Llama4Transform.tokenize_messages (Llama4Tokenizer's for
            truncation_type "left", which Llama4Transform cannot ask for)
  pieces    text and its pre-tokenizer pieces, from tiktoken with a
            vocabulary holding every substring of the texts (each piece is
            then one token, and no merge hides a boundary)
"""
import importlib.util
import json
import logging
import os
import sys
import types


def stub(name, path=None, **attrs):
    m = types.ModuleType(name)
    if path is not None:
        m.__path__ = [path]
    for k, v in attrs.items():
        setattr(m, k, v)
    sys.modules[name] = m
    if "." in name:
        parent, _, leaf = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], leaf, m)
    return m


def load_torchtune(src):
    tt = os.path.join(src, "torchtune")
    if not os.path.isfile(os.path.join(tt, "models", "llama4", "_tokenizer.py")):
        sys.exit(f"gen_golden.py: no torchtune/models/llama4/_tokenizer.py under {src}")

    class Dummy:
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            raise RuntimeError("gen_golden.py: an image transform stub was called")

    # Third-party modules the imported files name but the text path never uses.
    stub("torchvision", "", transforms=None)
    stub("torchvision.transforms", "")
    stub("torchvision.transforms.v2", None, Compose=Dummy, Resize=Dummy, ToImage=Dummy,
         ToDtype=Dummy, Normalize=Dummy)
    stub("PIL", "")
    stub("PIL.Image", None, Image=Dummy)
    stub("datasets", "", load_dataset=Dummy)
    stub("datasets.distributed", None, split_dataset_by_node=Dummy)

    # torchtune's packages as bare namespaces: their __init__.py never runs.
    stub("torchtune", tt)
    stub("torchtune.utils", os.path.join(tt, "utils"), get_logger=logging.getLogger,
         get_world_size_and_rank=lambda: (1, 0))
    stub("torchtune.data", os.path.join(tt, "data"))
    stub("torchtune.modules", os.path.join(tt, "modules"))
    stub("torchtune.models", os.path.join(tt, "models"))
    stub("torchtune.models.llama4", os.path.join(tt, "models", "llama4"))
    stub("torchtune.models.clip", None, CLIPImageTransform=Dummy)

    import torchtune.data._messages as messages
    import torchtune.data._utils as data_utils

    class PromptTemplateInterface:
        pass

    stub("torchtune.data._prompt_templates", None, PromptTemplateInterface=PromptTemplateInterface,
         _TemplateType=object, _get_prompt_template=None)
    d = sys.modules["torchtune.data"]
    d.Message, d.truncate, d.PromptTemplateInterface = messages.Message, data_utils.truncate, PromptTemplateInterface
    d.mask_messages = messages.mask_messages

    import torchtune.modules.transforms  # noqa: F401  (real: only _transforms.py)

    tokpath = os.path.join(tt, "modules", "transforms", "tokenizers")
    stub("torchtune.modules.transforms.tokenizers", tokpath)
    import torchtune.modules.transforms.tokenizers._tiktoken as tiktoken_mod
    import torchtune.modules.transforms.tokenizers._utils as tok_utils

    for name in ("torchtune.modules.transforms.tokenizers", "torchtune.modules.tokenizers"):
        stub(name, tokpath if name.endswith("transforms.tokenizers") else None,
             TikTokenBaseTokenizer=tiktoken_mod.TikTokenBaseTokenizer,
             ModelTokenizer=tok_utils.ModelTokenizer, BaseTokenizer=tok_utils.BaseTokenizer,
             parse_hf_tokenizer_json=tok_utils.parse_hf_tokenizer_json)

    import torchtune.models.llama4._tokenizer as l4tok
    import torchtune.models.llama4._transform as l4tr
    return l4tok, l4tr, messages


# ---- the inputs ---------------------------------------------------------------------

ENCODE_TEXTS = [
    # torchtune's own test sentence (torchtune's tokenizer tests give its expected ids)
    "I can see the sun. But even if I cannot see the sun, I know that it exists.",
    "Hello world!", "hello", "", " ", "  ", "\n", "\n\n", "\t", "a\tb", "line1\nline2\r\nline3\rline4",
    "   leading spaces", "trailing spaces   ", "multiple    spaces   between  words",
    "\n\n\n\nnewlines first", " \n \n ", "tabs\t\t\tand spaces  \t end", "a  \n\n  b",
    # numbers and punctuation
    "1234567890", "3.14159 and 2.71828", "1,000,000 people in 2024-01-01", "x=42;y=-7;z=x*y",
    "Hello, world! How's it going?", "!!!???...;;;", "(a+b)*c/d - e^f", "email@example.com",
    "https://example.com/path/to/page?q=1&r=2#frag", "C:\\path\\to\\file.txt",
    "#include <stdio.h>\nint main(void) { return 0; }\n", "def f(x):\n    return x ** 2\n\n\nprint(f(3))",
    '{"key": [1, 2, 3], "nested": {"a": null}}',
    # contractions, and the case-insensitive suffix group
    "don't", "Don't", "DON'T", "I'm sure you're right, we've seen they'll go and she'd stay; it's fine.",
    "IT'S THE DOG'S BONE", "rock'n'roll o'clock", "'s 's 'S", "donſt can'ſ", "'twas the night",
    # long words (the long merge path: pieces over 128 bytes)
    "supercalifragilisticexpialidocious", "pneumonoultramicroscopicsilicovolcanoconiosis",
    "a" * 200, "the" * 60, "antidisestablishmentarianism" * 8,
    # accents, scripts, emoji
    "café naïve résumé", "Ångström Straße İstanbul ǅemal", "e\u0301 combining a\u0308\u0301", "ÀÉÎÕÜ àéîõü",
    "Αλφάβητο ΑΒΓ", "Привет, мир! ПРИВЕТ", "مرحبا بالعالم", "שלום עולם", "नमस्ते दुनिया", "สวัสดีชาวโลก",
    "你好，世界！今天天气很好。", "こんにちは世界、カタカナとひらがな", "안녕하세요 세계", "😀 👍🏽 🎉🎉",
    "❤️‍🔥 family: 👨‍👩‍👧‍👦 flags 🇺🇸🇯🇵", "∑∫√∞≠≤ ½ ² ٣ ४ Ⅻ ①", "mixed中文and English混合123",
    # whitespace and controls: \s is Unicode White_Space, isspace/strip are Python's
    "a\u00a0b\u3000c\u2028d", "\u180e\u180e abc \u180e", "a\x85b\x85", "\x0b\x0c\x1c\x1d\x1e\x1f end",
    "zero\u200bwidth\u200cjoin", "\ufeffBOM first", "\x00null\x01ctrl\x7f", "\U0010fffd\U00010000",
    # special-token text: plain text to torchtune's encode
    "<|begin_of_text|>", "Hello <|eot|> world", "<|header_start|>user<|header_end|>\n\nhi<|eot|>",
    "<|reserved_special_token_5|><|image|><|patch|>", "<|notaspecial|> and < | eot | >", "<|a\nb|> <||>",
]

# Too long to store: each text is [piece, repeat] segments, and its ids are
# kept as their count, a hash (fnv1a64 below), and the first and last 16.
LONG_TEXTS = [
    ("a run of 30000 letters (cut at 25000)", [["a", 30000]]),
    ("25003 spaces then a word", [[" ", 25003], ["word", 1]]),
    ("25001 non-space characters mixed", [["ab.cd!", 4166], ["ab.cd", 1], [" x", 1]]),
    ("400,000-character slices", [["abcd ", 79999], ["xyzxyzxyz tail", 1]]),
    ("cjk over 25000 characters", [["漢字", 13000]]),
]

# Decoded, not encoded: bytes that are not UTF-8, eos placement, specials,
# and text that looks special. A list holds ids; a str is its bytes' ids.
DECODE_CASES = [
    [0xE4, 0xBD], [0xE4, 0xBD, 0x41], [0xF0, 0x80, 0x41], [0xED, 0xA0, 0x80], [0xC0, 0xAF], [0xFF, 0xFE],
    [0xF4, 0x90, 0x80, 0x80], [0xE2, 0x82], [0xE2, 0x82, 0xAC], [0xF0, 0x9F, 0x98], [0x80, 0x41, 0xBF],
    [0xF0, 0x9F, 0x98, 0x80, 0xE4], [0xC3], [0xE0, 0x80, 0x80], [0xEF, 0xBF, 0xBD],
    [200001, 72, 105], [72, 200001, 105], [200000, 72, 200001, 105, 200001], [200001], [200001, 200001, 65],
    [200005, "user", 200006, "\n\n", "hi", 200008], [200005, "user", 200006, "hi"],
    [200005, "a\nb", 200006, "\n\n", "x"], [200005, "x", 200006, "\n", "y"],
    ["<|foo|> bar <|baz\n|> <|x|y|>"], ["<|header_start|>sys<|header_end|>\n\nkeep"],
    [200019, 200079, 200093, 201133, 201144, 202047, 200018, 201142],
    [2000], [199999], [202048],
    [],
]


def chat_cases(Message):
    def m(role, content, eot=True):
        return Message(role=role, content=content, eot=eot)

    ua = [m("user", "Hello, how are you?"), m("assistant", "I am fine, thank you.")]
    sua = [m("system", "You are a helpful assistant."), *ua]
    multi = [m("system", "Be brief."), m("user", "What is 2+2?"), m("assistant", "4."),
             m("user", "And 3+3?"), m("assistant", "6.")]
    tool = [m("user", "What's the weather in Paris?"),
            m("assistant", "[get_weather(city='Paris')]", eot=False), m("ipython", "{\"temp\": 21}", eot=False),
            m("assistant", "It is 21 degrees in Paris.")]
    ws = [m(" user\t", "  \n padded content \u3000\n "), m("assistant", "\t\n"),
          m("user", "<|eot|> typed by the user"), m("assistant", "ok 👍")]
    # (name, messages, masking strategy, max_seq_len, add_end_tokens, truncation_type)
    return [
        ("user-assistant", ua, "train_on_assistant", None, True, None),
        ("system, train_on_input=True", sua, "train_on_all", None, True, None),
        ("system, train_on_input=False", sua, "train_on_assistant", None, True, None),
        ("multi-turn train_on_last", multi, "train_on_last", None, True, None),
        ("multi-turn train_on_assistant", multi, "train_on_assistant", None, True, None),
        ("tool call, eom", tool, "train_on_assistant", None, True, None),
        ("whitespace, special text", ws, "train_on_all", None, True, None),
        ("inference: no end tokens", ua, "train_on_assistant", None, False, None),
        ("max_seq_len 20, mid-message", multi, "train_on_assistant", 20, True, None),
        ("max_seq_len 20, no end tokens", multi, "train_on_assistant", 20, False, None),
        ("max_seq_len at a message end", ua, "train_on_assistant", 10, True, None),
        ("max_seq_len 5", sua, "train_on_all", 5, True, None),
        ("max_seq_len 1", ua, "train_on_assistant", 1, True, None),
        ("max_seq_len larger than the chat", multi, "train_on_last", 1000, True, None),
        ("left truncation (Llama4Tokenizer)", multi, "train_on_assistant", 24, True, "left"),
        ("left truncation, no end tokens", multi, "train_on_all", 24, False, "left"),
    ]


# Texts whose pre-tokenizer pieces are recorded: the test vocabulary hides
# most boundaries (its merges are few), so these are split with a vocabulary
# holding every substring of them, where each piece is its own token.
PATTERN_TEXTS = [
    "\u180e\u180e abc \u180e x", "a\x85\x85b \x85", "x\u00a0\u00a0y\u3000\u3000z", "don'ſ DON'S o'Re",
    "Hello world  \n\n  foo\r\nbar", "12345 1.5 ½² ٣४", "   x\t\ty  ", "CamelCaseWord HTTPServer iPhone",
    "Ǆǅǆ ǈ ʰʱ ᵃ", "e\u0301\u0302x \u0301", "a/b//c\n//\n", "!!! ?? ...\n\n", "漢字かなカナ한글", "😀👍🏽 x",
]


def fnv1a64(ids):
    h = 0xCBF29CE484222325
    for i in ids:
        for byte in (i & 0xFFFFFFFF).to_bytes(4, "little"):
            h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def decodes(tok, ids):
    out = {}
    for trunc in (True, False):
        for skip in (True, False):
            key = f"decode_{'t' if trunc else 'f'}{'s' if skip else 'k'}"
            try:
                out[key] = tok.decode(ids, truncate_at_eos=trunc, skip_special_tokens=skip)
            except KeyError:
                out[key] = None  # torchtune raises: the C decode must fail
    return out


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    src, model, out_path = sys.argv[1:]
    l4tok, l4tr, messages = load_torchtune(src)
    import base64
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    transform = l4tr.Llama4Transform(model, tile_size=224, patch_size=14)
    tok = transform.tokenizer
    ranks = load_tiktoken_bpe(model)
    lines = []
    lines.append({"kind": "meta", "pattern": l4tok.O200K_PATTERN, "base_vocab_size": tok.base_vocab_size,
                  "vocab_size": tok.vocab_size, "bos_id": tok.bos_id, "eos_id": tok.eos_id, "pad_id": tok.pad_id,
                  "special_tokens": tok.special_tokens})

    for text in ENCODE_TEXTS:
        with_ = transform.encode(text, add_bos=True, add_eos=True)
        bare = transform.encode(text, add_bos=False, add_eos=False)
        lines.append({"kind": "encode", "text": text, "ids": with_, "ids_bare": bare, **decodes(transform, with_)})
    for name, segments in LONG_TEXTS:
        text = "".join(p * k for p, k in segments)
        with_ = transform.encode(text, add_bos=True, add_eos=True)
        lines.append({"kind": "encode_long", "name": name, "segments": segments, "n": len(with_),
                      "ids_fnv1a64": fnv1a64(with_), "head": with_[:16], "tail": with_[-16:],
                      "roundtrip": transform.decode(with_) == text})

    for case in DECODE_CASES:
        ids = []
        for x in case:
            if isinstance(x, str):
                ids += [ranks[bytes([c])] for c in x.encode()]
            elif x < 256:
                ids.append(ranks[bytes([x])])
            else:
                ids.append(x)
        lines.append({"kind": "decode", "ids": ids, **decodes(transform, ids)})

    for name, msgs, strategy, max_seq_len, add_end, truncation in chat_cases(messages.Message):
        messages.mask_messages(msgs, strategy)
        if truncation is None:
            transform.max_seq_len = transform.tokenizer.max_seq_len = max_seq_len
            t = transform
        else:
            t = l4tok.Llama4Tokenizer(model, max_seq_len=max_seq_len, truncation_type=truncation)
        tokens, mask = t.tokenize_messages(msgs, add_end_tokens=add_end)
        lines.append({"kind": "chat", "name": name, "strategy": strategy, "max_seq_len": max_seq_len or 0,
                      "add_end_tokens": add_end, "truncation_type": truncation or "right",
                      "messages": [{"role": x.role, "content": x.text_content, "masked": x.masked, "eot": x.eot}
                                   for x in msgs],
                      "tokens": tokens, "mask": mask})
    transform.max_seq_len = transform.tokenizer.max_seq_len = None

    # Pieces: every substring of 2+ bytes is a token, so no merge runs and
    # each regex match comes back as one id.
    sub = {bytes([i]): i for i in range(256)}
    for text in PATTERN_TEXTS:
        b = text.encode()
        for i in range(len(b)):
            for j in range(i + 2, len(b) + 1):
                sub.setdefault(b[i:j], len(sub))
    enc = tiktoken.Encoding("pieces", pat_str=l4tok.O200K_PATTERN, mergeable_ranks=sub, special_tokens={})
    inv = {v: k for k, v in sub.items()}
    for text in PATTERN_TEXTS:
        pieces = [inv[i].decode() for i in enc.encode(text, allowed_special=set(), disallowed_special=())]
        assert "".join(pieces) == text
        lines.append({"kind": "pieces", "text": text, "pieces": pieces})

    with open(out_path, "w") as f:
        for line in lines:
            f.write(json.dumps(line, ensure_ascii=True) + "\n")
    print(f"gen_golden.py: wrote {len(lines)} cases to {out_path}")


if __name__ == "__main__":
    main()
