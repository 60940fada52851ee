"""Load lit-embed exports with transformers alone: run as a script, where importing lit_embed fails.

    python export_loader.py JOBS.json

Each job ``{"folder", "auto", "inputs" | "texts", "out"}`` loads ``folder`` with ``transformers.<auto>``
(``trust_remote_code=True``, unless the job says ``"trust": false``), runs it on ``inputs`` (tensors as lists) or on
``texts`` (hash strategies' ``model.encode_texts``, else the folder's tokenizer)
and saves the inputs and the hidden states (``AutoModel``) or logits to ``out`` (``torch.save``). A job with
``"refused": true`` only loads, and saves ``{"error": the message of what loading raised, or None}``; one with
``"pipeline": TEXTS`` also serves the folder with ``pipeline("text-classification", model=folder)`` (no
``trust_remote_code``) and saves its answers as ``"served"``.
"""

import importlib.abc
import json
import sys


class BlockLitEmbed(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "lit_embed" or name.startswith("lit_embed."):
            raise ImportError(f"{name} must not be imported by an export")


sys.meta_path.insert(0, BlockLitEmbed())

import torch  # noqa: E402
import transformers  # noqa: E402

for job in json.loads(open(sys.argv[1]).read()):
    if job.get("refused"):
        try:
            getattr(transformers, job["auto"]).from_pretrained(job["folder"], trust_remote_code=True)
            error = None
        except Exception as raised:  # what a tampered config.json makes the export's own code refuse
            error = str(raised)
        torch.save({"error": error}, job["out"])
        continue
    trust = job.get("trust", True)
    model = getattr(transformers, job["auto"]).from_pretrained(job["folder"], trust_remote_code=trust).eval()
    if "texts" in job and job["auto"] == "AutoModel":  # a hash strategy: the folder hashes words itself
        inputs = model.encode_texts(job["texts"])
    elif "texts" in job:  # the folder's tokenizer
        tokenizer = transformers.AutoTokenizer.from_pretrained(job["folder"], trust_remote_code=trust)
        inputs = dict(tokenizer(job["texts"], return_tensors="pt", padding=True, return_token_type_ids=False))
    else:
        inputs = {key: torch.tensor(value) for key, value in job["inputs"].items()}
    with torch.no_grad():
        output = model(**inputs)
    value = output.last_hidden_state if job["auto"] == "AutoModel" else output.logits
    served = transformers.pipeline("text-classification", model=job["folder"])(job["pipeline"]) if "pipeline" in job else None
    torch.save({"inputs": inputs, "output": value, "class": type(model).__name__, "served": served}, job["out"])
print("lit_embed imported:", any(name.startswith("lit_embed") for name in sys.modules))
