#!/usr/bin/env python3
"""gen_golden.py: writes tests/data's inputs and the expected output of
torchtune's own datasets on them, which the data tests (tests/ir/data/) check
`optc data --dump` against, exactly.

    .venv/bin/python tests/data/gen_golden.py TORCHTUNE_SRC

TORCHTUNE_SRC is a directory holding torchtune's source package, e.g.
    git -C TORCHTUNE_CLONE archive HEAD torchtune | tar -x -C /tmp/tt   (a clone of github.com/pytorch/torchtune)
    .venv/bin/python tests/data/gen_golden.py /tmp/tt
It needs torch, tiktoken, datasets and pyarrow (pip install datasets pyarrow
into the venv; the C tests need none of them). Run gen_parquet.py first: the
Parquet cases read its files.

What it writes, in tests/data/:
  alpaca_small.json     an alpaca dataset as one JSON array (alpaca_data.json's shape)
  sharegpt_small.jsonl, openai_small.jsonl, qa_small.jsonl
                        chat (ShareGPT, OpenAI) and question/answer data, JSON Lines
  golden/CASE.jsonl     for each cases/CASE.yaml: torchtune's dataset built from
                        that config's tokenizer and dataset blocks, every sample as
                        {"tokens": [...], "labels": [...]} (packs also "input_pos",
                        "seq_lens"), one line each
  splits.jsonl          split strings on n rows through load_dataset itself: each sub's
                        [from, to) (ReadInstruction's, checked against the rows it
                        returned), or the error it raised

How torchtune runs here: torchtune/__init__.py refuses to load without
torchao and imports the whole library, so (as tests/tokenizer/gen_golden.py
does) torchtune's packages are registered as bare namespaces and only the
files on the text path are imported: the llama4 tokenizer and transform,
torchtune/data/_messages.py, _utils.py, _common.py, and
torchtune/datasets/_sft.py, _alpaca.py, _chat.py, _instruct.py, _packed.py.
torchvision and PIL are stubbed (images are never touched); `datasets` is the
real Hugging Face library, so load_dataset reads the files exactly as
torchtune's own runs would. Each config's blocks are instantiated as
torchtune's config.instantiate would: the component's function called with
the block's keys.
"""
import json
import logging
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))


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
    import datasets  # noqa: F401  (real; imported before PIL is stubbed, which it probes for)

    tt = os.path.join(src, "torchtune")
    if not os.path.isfile(os.path.join(tt, "datasets", "_sft.py")):
        sys.exit(f"gen_golden.py: no torchtune/datasets/_sft.py under {src}")

    class Dummy:
        def __init__(self, *a, **k):
            pass

        def __call__(self, *a, **k):
            raise RuntimeError("gen_golden.py: an image transform stub was called")

    stub("torchvision", "", transforms=None)
    stub("torchvision.transforms", "")
    stub("torchvision.transforms.v2", None, Compose=Dummy, Resize=Dummy, ToImage=Dummy, ToDtype=Dummy,
         Normalize=Dummy)
    stub("PIL", "")
    stub("PIL.Image", None, Image=Dummy)
    stub("torchtune", tt)
    stub("torchtune.utils", os.path.join(tt, "utils"), get_logger=logging.getLogger,
         get_world_size_and_rank=lambda: (1, 0))
    for pkg in ("data", "datasets", "modules", "models"):
        stub("torchtune." + pkg, os.path.join(tt, pkg))
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
    d.mask_messages, d.InputOutputToMessages = messages.mask_messages, messages.InputOutputToMessages

    import torchtune.modules.transforms  # noqa: F401  (real: only _transforms.py)

    tokpath = os.path.join(tt, "modules", "transforms", "tokenizers")
    stub("torchtune.modules.transforms.tokenizers", tokpath)
    import torchtune.modules.transforms.tokenizers._tiktoken as tiktoken_mod
    import torchtune.modules.transforms.tokenizers._utils as tok_utils

    for name in ("torchtune.modules.transforms.tokenizers", "torchtune.modules.tokenizers"):
        stub(name, tokpath if name.endswith("transforms.tokenizers") else None,
             TikTokenBaseTokenizer=tiktoken_mod.TikTokenBaseTokenizer, ModelTokenizer=tok_utils.ModelTokenizer,
             BaseTokenizer=tok_utils.BaseTokenizer, parse_hf_tokenizer_json=tok_utils.parse_hf_tokenizer_json)

    import torchtune.models.llama4._transform as l4tr
    import torchtune.datasets._alpaca as alpaca
    import torchtune.datasets._chat as chat
    import torchtune.datasets._instruct as instruct

    def llama4_transform(path, max_seq_len=8192, image_size=336, max_num_tiles=16, special_tokens_path=None,
                         prompt_template=None):
        # torchtune/models/llama4/_model_builders.py's llama4_transform, verbatim in effect
        return l4tr.Llama4Transform(path=path, special_tokens_path=special_tokens_path, tile_size=image_size,
                                    patch_size=14, max_num_tiles=max_num_tiles, max_seq_len=max_seq_len,
                                    image_mean=[0.5, 0.5, 0.5], image_std=[0.5, 0.5, 0.5],
                                    prompt_template=prompt_template)

    return {
        "torchtune.models.llama4.llama4_transform": llama4_transform,
        "torchtune.datasets.alpaca_dataset": alpaca.alpaca_dataset,
        "torchtune.datasets.alpaca_cleaned_dataset": alpaca.alpaca_cleaned_dataset,
        "torchtune.datasets.chat_dataset": chat.chat_dataset,
        "torchtune.datasets.instruct_dataset": instruct.instruct_dataset,
    }


# ---- the inputs ------------------------------------------------------------------------

ALPACA = [
    {"instruction": "Give three tips for staying healthy.", "input": "",
     "output": "1. Eat a balanced diet.\n2. Exercise regularly.\n3. Sleep well."},
    {"instruction": "Translate the sentence to French.", "input": "The cat sleeps.", "output": "Le chat dort."},
    {"instruction": "What is the capital of France?", "input": "", "output": "Paris."},
    {"instruction": "Summarize the text.", "input": "  Leading and trailing spaces are stripped by the chat format.  ",
     "output": "\n\nThe content is stripped.\n\n"},
    {"instruction": "Write a haiku about the sea.", "input": None,
     "output": "Waves fold into foam,\nsalt wind carries gull voices,\nthe tide keeps its time."},
    {"instruction": "Name a café in Paris 🙂.", "input": "", "output": "Café de Flore — naïve résumé, 東京 too."},
    {"instruction": "Repeat the special-looking text.", "input": "<|eot|> and <|begin_of_text|>",
     "output": "They are <|eot|> plain text here."},
    {"instruction": "Format {this} with braces.", "input": "{input}", "output": "{output} {0} {}"},
    {"instruction": "Explain photosynthesis.", "input": "",
     "output": "Photosynthesis is the process by which green plants and some other organisms use sunlight to "
               "synthesize foods from carbon dioxide and water. It generally involves the green pigment "
               "chlorophyll and generates oxygen as a byproduct. The light reactions make ATP and NADPH; the "
               "Calvin cycle then fixes carbon into sugars."},
    {"instruction": "Line endings.", "input": "a\r\nb\rc", "output": "one\r\ntwo\tthree"},
    {"instruction": "Sort the numbers.", "input": "5, 3, 9, 1", "output": "1, 3, 5, 9"},
    {"instruction": "Is 17 prime?", "input": "", "output": "Yes."},
    {"instruction": "Give a one-word answer.", "input": "", "output": "OK"},
    {"instruction": "Describe the color blue to someone who cannot see.", "input": "",
     "output": "Blue feels like cool water on your skin, or a calm deep breath of fresh morning air."},
    {"instruction": "Convert to upper case.", "input": "hello world", "output": "HELLO WORLD"},
    {"instruction": "Continue the pattern.", "input": "2, 4, 8, 16", "output": "32, 64, 128"},
]

SHAREGPT = [
    {"conversations": [{"from": "human", "value": "What time is it in London?"},
                       {"from": "gpt", "value": "It is 10:00 AM in London."}]},
    {"conversations": [{"from": "system", "value": "You are terse."},
                       {"from": "human", "value": "Hi!"}, {"from": "gpt", "value": "Hello."},
                       {"from": "human", "value": "How are you?"}, {"from": "gpt", "value": "Fine."}]},
    {"conversations": [{"from": "human", "value": "  spaces  "}, {"from": "gpt", "value": "\tstripped\n"}]},
    {"conversations": [{"from": "system", "value": "Answer in French."},
                       {"from": "human", "value": "Good morning"}, {"from": "gpt", "value": "Bonjour 🌞"}]},
]

OPENAI = [
    {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}]},
    {"messages": [{"role": "system", "content": "Be helpful."}, {"role": "user", "content": "Name a fruit."},
                  {"role": "assistant", "content": "An apple."}, {"role": "user", "content": "Another?"},
                  {"role": "assistant", "content": "A pear."}]},
    {"messages": [{"role": "user", "content": "Say <|eot|>."}, {"role": "assistant", "content": "<|eot|>"}]},
]

QA = [
    {"question": "What is the boiling point of water at sea level?", "answer": "100 degrees Celsius.", "id": 1},
    {"question": "Who wrote Hamlet?", "answer": "William Shakespeare.", "id": 2},
    {"question": "  What is   whitespace?  ", "answer": "\nSpace, tabs\tand newlines.\n", "id": 3},
]


# `optc tokenize` input: one text per line (so no newlines inside)
TOKENIZE_LINES = [
    "I can see the sun. But even if I cannot see the sun, I know that it exists.",
    "", "Hello world!", "  leading and trailing spaces  ", "tabs\tinside\tand\tend\t", "carriage return\r",
    "café naïve résumé — 東京 🙂 👨‍👩‍👧", "1234567890 3.14159", "don't DON'T we've", "<|eot|> looks special",
    "<|begin_of_text|>x<|end_of_text|>", "a" * 300, "def f(x): return x ** 2  # code",
]


def write_inputs():
    with open(os.path.join(HERE, "alpaca_small.json"), "w") as f:
        json.dump(ALPACA, f, indent=2, ensure_ascii=False)
        f.write("\n")
    for name, rows in (("sharegpt_small.jsonl", SHAREGPT), ("openai_small.jsonl", OPENAI),
                       ("qa_small.jsonl", QA)):
        with open(os.path.join(HERE, name), "w") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")


# ---- torchtune's datasets on the cases ---------------------------------------------------------

def instantiate(table, block, **extra):
    kw = {k: v for k, v in block.items() if k != "_component_"}
    kw.update(extra)
    return table[block["_component_"]](**kw)


def as_list(v):
    return [int(x) for x in (v.tolist() if hasattr(v, "tolist") else v)]


def run_case(table, path):
    import yaml

    cfg = yaml.safe_load(open(path))
    tok = instantiate(table, cfg["tokenizer"])
    blocks = cfg["dataset"] if isinstance(cfg["dataset"], list) else [cfg["dataset"]]
    lines = []
    for block in blocks:  # a list is torchtune's ConcatDataset: each dataset in turn
        ds = instantiate(table, block, tokenizer=tok)
        for i in range(len(ds)):
            s = ds[i]
            row = {"tokens": as_list(s["tokens"]), "labels": as_list(s["labels"])}
            if "input_pos" in s:
                row["input_pos"] = as_list(s["input_pos"])
                row["seq_lens"] = as_list(s["seq_lens"])
            lines.append(json.dumps(row, separators=(", ", ": ")))
    return lines


def write_tokenize(table):
    """torchtune's encode(line, add_bos=True, add_eos=True) of each line, and
    decode (its defaults) of those ids."""
    tok = table["torchtune.models.llama4.llama4_transform"]("../tokenizer/tiktoken_small_llama4.model")
    with open("tokenize_lines.txt", "w", newline="") as f:
        f.write("".join(line + "\n" for line in TOKENIZE_LINES))
    with open(os.path.join("golden", "tokenize_lines.ids"), "w") as f, \
            open(os.path.join("golden", "tokenize_lines.decoded"), "w", newline="") as g:
        for line in TOKENIZE_LINES:
            ids = tok.encode(line, add_bos=True, add_eos=True)
            f.write(" ".join(map(str, ids)) + "\n")
            text = tok.decode(ids)
            if "<|" not in line:
                assert text == line, (line, text)  # a round trip, but for special-looking text
            g.write(text + "\n")


# ---- split strings --------------------------------------------------------------------------

SPLIT_SPECS = [
    "train", "train[:95%]", "train[95%:]", "train[10:200]", "train[-5%:]", "train[:-5%]", "train[-5:]", "train[:0]",
    "train[33%:67%]", "train[1%:2%]", "train[:33%]", "train[-33%:]", "train[0%:100%]", "train[:]", "train[5:2]",
    "train[-100%:-50%]", "train[-101:]", "train[1_0:2_0]", "train[10:50%]", "train[50%:10]",
    "train[:50%](pct1_dropremainder)", "train[10%:](closest)", "train[-7%:-2%](pct1_dropremainder)",
    "train+train[:10]", "train[:10%] + train[-10%:]", "train[:1]+train[:1%]",
    # errors
    "train[10:20](closest)", "train[101%:]", "train[-101%:]", "train[:10%]+train[10%:20%](pct1_dropremainder)",
    "train[50%]", "train[]", "train()", "train(closest)", "train[2.5%:]", "train[_1:]", "train[1__0:]",
    "train[%:]", " train", "train [1:2]", "train[:10%](rounding)", "tr ain", "",
]
SPLIT_SIZES = [1, 3, 7, 10, 16, 99, 100, 101, 250, 1000, 12345]


def write_splits():
    """Each spec on a JSON Lines file of n rows, through load_dataset itself:
    the rows it returns (checked to be the subs' [from, to) of
    ReadInstruction.to_absolute, concatenated) or the error it raises."""
    import tempfile

    import datasets
    from datasets import ReadInstruction

    datasets.disable_progress_bars()
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in SPLIT_SIZES:
            p = os.path.join(tmp, f"rows{n}.jsonl")
            with open(p, "w") as f:
                for i in range(n):
                    f.write(json.dumps({"i": i}) + "\n")
            for spec in SPLIT_SPECS:
                rec = {"spec": spec, "n": n}
                try:
                    got = list(datasets.load_dataset("json", data_files=p, split=spec, cache_dir=tmp)["i"])
                except Exception as e:  # noqa: BLE001  (ValueError, mostly)
                    rec["error"] = str(e)
                else:
                    subs = ReadInstruction.from_spec(spec).to_absolute({"train": n})
                    rec["ranges"] = [[a.from_, a.to] for a in subs]
                    assert got == [i for a in subs for i in range(a.from_, a.to)], (spec, n, got)
                out.append(rec)
    with open(os.path.join(HERE, "splits.jsonl"), "w") as f:
        for r in out:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    os.chdir(HERE)  # the cases' paths are relative to tests/data
    os.environ.setdefault("HF_DATASETS_CACHE", os.path.join("/tmp", f"optc-gen-golden-{os.getpid()}"))
    logging.disable(logging.WARNING)
    write_inputs()
    table = load_torchtune(sys.argv[1])
    os.makedirs("golden", exist_ok=True)
    for name in sorted(os.listdir("cases")):
        if not name.endswith(".yaml"):
            continue
        lines = run_case(table, os.path.join("cases", name))
        with open(os.path.join("golden", name[:-5] + ".jsonl"), "w") as f:
            f.write("".join(line + "\n" for line in lines))
        print(f"{name}: {len(lines)} samples")
    write_tokenize(table)
    write_splits()
    print("splits.jsonl: %d cases" % (len(SPLIT_SPECS) * len(SPLIT_SIZES)))


if __name__ == "__main__":
    main()
