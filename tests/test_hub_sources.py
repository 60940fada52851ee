"""Hub names that load with the datasets we install: pinned task commits, no loading scripts, CC-100's files."""

from __future__ import annotations

import lzma

import datasets
import pytest

from lit_embed.commands import main
from lit_embed.data.corpus import CorpusDataModule
from lit_embed.data.finetune import TaskDataModule, load_from_hub, split_files
from lit_embed.data.sources import load_hub
from lit_embed.data.tasks import TASKS, XNLI_LANGUAGES, get_task
from lit_embed.errors import ConfigError, HubError, MissingFileError
from tests.helpers import CONFIGS

TEXTS = [f"line {i} of a compressed corpus, with é and 漢字" for i in range(200)]
SCRIPT_REFUSAL = RuntimeError("Dataset scripts are no longer supported, but found cc100.py")


def test_every_hub_task_is_pinned_to_a_full_commit():
    for task in TASKS.values():
        if task.benchmark != "sample":
            assert task.revision and len(task.revision) == 40 and int(task.revision, 16) >= 0, task.name
    assert get_task("rte").revision == "0de23925db68e9cf6287d3776a0f67f5267a42eb"
    assert get_task("xnli").revision == "83ecd0da7773326e49a494fca44b9467b27103c8"


def test_jglue_reads_its_parquet_conversion_at_the_pinned_commit_and_marc_ja_by_its_own_names():
    at = "hf://datasets/shunk031/JGLUE@3a4a622d8ae03c700184c17da7afa1d3dc870cd3"
    assert get_task("jnli").hub_files("JNLI", "train") == f"{at}/JNLI/train/*.parquet"
    assert get_task("jcola").hub_files("JCoLA", "validation") == f"{at}/JCoLA/validation/*.parquet"
    assert get_task("marc_ja").hub_files("MARC-ja", "validation") == f"{at}/MARC-ja/jglue-validation.parquet"
    assert get_task("rte").hub_files("rte", "train") is None  # GLUE: the repository's own configs


def test_tasks_load_from_the_hub_at_their_commit(monkeypatch):
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: calls.append((args, kwargs)) or "rows")
    assert load_from_hub(get_task("rte"), "rte", "train") == "rows"
    assert load_from_hub(get_task("marc_ja"), "MARC-ja", "train") == "rows"
    assert calls[0] == (("nyu-mll/glue", "rte"), {"split": "train", "revision": "0de23925db68e9cf6287d3776a0f67f5267a42eb"})
    assert calls[1][0] == ("parquet",)
    assert calls[1][1]["data_files"] == {"train": get_task("marc_ja").hub_files("MARC-ja", "train")}


def test_marc_ja_files_downloaded_from_the_conversion_are_read_from_data_dir(tmp_path):
    folder = tmp_path / "MARC-ja"
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "index.duckdb").write_bytes(b"not data")  # the conversion's leftover index
    for split in ("train", "validation"):
        datasets.Dataset.from_dict({"sentence": ["良い", "悪い"], "label": [0, 1]}).to_parquet(folder / f"jglue-{split}.parquet")
    assert split_files(tmp_path, "MARC-ja", "train") == [folder / "jglue-train.parquet"]
    assert split_files(tmp_path, "MARC-ja", "validation") == [folder / "jglue-validation.parquet"]
    data = TaskDataModule("marc_ja", data_dir=str(tmp_path))
    assert data._load("MARC-ja", "validation", "validation")["sentence"] == ["良い", "悪い"]


@pytest.mark.parametrize("name", ["statmt/cc100:ar", "cc100", "bookcorpus/bookcorpus", "BookCorpus", "shunk031/JGLUE"])
def test_known_loading_scripts_are_refused_when_the_corpus_is_built(name, monkeypatch):
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: pytest.fail("nothing may be downloaded"))
    with pytest.raises(ConfigError, match="loading script on the hub, which datasets 4\\+ refuses"):
        CorpusDataModule("all-MiniLM-L6-v2", datasets=["wikimedia/wikipedia:20231101.en", name])


def test_a_config_naming_cc100_exits_2_before_any_download_with_the_files_route(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    status = main(["fit", "--config", str(CONFIGS / "demo.yaml"), "--data.init_args.files", "null",
                   "--data.init_args.datasets", "[statmt/cc100:en, statmt/cc100:de]"])
    err = capsys.readouterr().err
    assert status == 2
    assert "'statmt/cc100:en', 'statmt/cc100:de'" in err and "https://data.statmt.org/cc-100/LANG.txt.xz" in err


def test_a_loading_script_the_hub_refuses_becomes_lit_embeds_advice(monkeypatch):
    def refuse(*args, **kwargs):
        raise SCRIPT_REFUSAL

    monkeypatch.setattr(datasets, "load_dataset", refuse)
    with pytest.raises(HubError, match="'someone/corpus' is a loading script.*pass them with `files:`"):
        load_hub("someone/corpus")
    with pytest.raises(HubError, match="'statmt/cc100:fr' is a loading script.*cc-100/LANG.txt.xz"):
        load_hub("statmt/cc100:fr")
    with pytest.raises(HubError, match="nyu-mll/glue@0de2392.* is a loading script.*data_dir"):
        load_from_hub(get_task("rte"), "rte", "train")
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("a bug")))
    with pytest.raises(RuntimeError, match="a bug"):  # other errors keep their traceback
        load_hub("someone/corpus")


def test_a_corpus_name_may_pin_a_commit(monkeypatch):
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: calls.append((args, kwargs)))
    load_hub("wikimedia/wikipedia@126488064a94417b849f69e1223923108896203e:20231101.en")
    load_hub("rojagtap/bookcorpus")
    assert calls[0] == (("wikimedia/wikipedia", "20231101.en"),
                        {"split": "train", "streaming": False, "revision": "126488064a94417b849f69e1223923108896203e"})
    assert calls[1] == (("rojagtap/bookcorpus", None), {"split": "train", "streaming": False, "revision": None})


@pytest.mark.parametrize("streaming", [False, True])
def test_cc100s_compressed_files_are_read_as_they_are(tmp_path, streaming):
    folder = tmp_path / "cc100"
    folder.mkdir()
    for lang, texts in (("en", TEXTS[:100]), ("ja", TEXTS[100:])):
        with lzma.open(folder / f"{lang}.txt.xz", "wt", encoding="utf-8") as handle:
            handle.write("\n".join(texts) + "\n")
    files = [str(folder / "en.txt.xz"), str(folder / "ja.txt.xz")]
    dm = CorpusDataModule("all-MiniLM-L6-v2", files=files, max_length=32, batch_size=4, val_size=2, streaming=streaming)
    assert list(dm.fit_texts()) == TEXTS
    dm.setup("fit")
    assert next(iter(dm.train_dataloader()))["codes"].shape == (4, 32)


def test_bad_bytes_in_a_compressed_file_are_named(tmp_path):
    with lzma.open(tmp_path / "bad.txt.xz", "wb") as handle:
        handle.write(b"fine\nbad \xff here\n")
    with pytest.raises(ConfigError, match=r"bad.txt.xz:2: not valid UTF-8"):
        next(CorpusDataModule("all-MiniLM-L6-v2", files=[str(tmp_path / "bad.txt.xz")]).fit_texts())


def test_missing_cc100_files_fail_when_the_module_is_built_with_the_download_loop(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "cc100").mkdir(parents=True)
    (tmp_path / "data" / "cc100" / "en.txt.xz").write_bytes(lzma.compress(b"present\n"))
    files = [f"data/cc100/{lang}.txt.xz" for lang in ("en", "de", "zh-Hans")]
    with pytest.raises(MissingFileError) as caught:
        CorpusDataModule("all-MiniLM-L6-v2", files=files)
    message = str(caught.value)
    assert "'data/cc100/de.txt.xz', 'data/cc100/zh-Hans.txt.xz' do not exist" in message and str(tmp_path) in message
    assert "for f in de.txt.xz zh-Hans.txt.xz; do wget -c -P data/cc100 https://data.statmt.org/cc-100/$f; done" in message


def test_the_shipped_corpus_configs_name_no_loading_script():
    import yaml

    from lit_embed.data.sources import SCRIPT_DATASETS, parse_hub_name

    for path in (CONFIGS / "data").glob("*.yaml"):
        names = yaml.safe_load(path.read_text())["init_args"].get("datasets") or []
        assert not [n for n in names if parse_hub_name(n)[0].lower() in SCRIPT_DATASETS], path.name
    cc100 = yaml.safe_load((CONFIGS / "data" / "cc100_xnli.yaml").read_text())["init_args"]
    assert len(cc100["files"]) == 15 and all(f.endswith(".txt.xz") for f in cc100["files"])
    # XNLI's 15 languages (its zh is CC-100's zh-Hans)
    assert {f.split("/")[-1].split(".")[0] for f in cc100["files"]} == {*XNLI_LANGUAGES} - {"zh"} | {"zh-Hans"}


# -- fail fast offline ---------------------------------------------------------------------------------------

@pytest.fixture
def silent_hub(monkeypatch):
    """A hub that takes each connection and hangs up without a word (on 127.0.0.1, a free port), as the hub's address
    behind a dead network does; ``HF_ENDPOINT`` points at it. Its value: how many connections it was asked for."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    asked = []

    def hang_up() -> None:
        while True:
            try:
                connection, _ = server.accept()
            except OSError:  # closed at teardown
                return
            asked.append(connection.getpeername())
            connection.close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    yield asked
    server.shutdown(socket.SHUT_RDWR)  # wakes the accept
    server.close()
    thread.join(5)


def test_a_hub_that_does_not_answer_is_asked_once_with_the_probes_timeout(silent_hub, monkeypatch):
    """One request, bounded by the probe's timeout: no retry, no wait on a library's longer default."""
    import urllib.request

    from lit_embed.hub import hub_answers

    timeouts = []
    real = urllib.request.urlopen
    monkeypatch.setattr(urllib.request, "urlopen", lambda request, timeout: timeouts.append(timeout) or real(request, timeout=timeout))
    assert hub_answers(timeout=1.0) is False
    assert timeouts == [1.0] and len(silent_hub) == 1


def test_without_network_a_config_naming_a_hub_model_asks_the_hub_once_and_fails_with_the_fix(silent_hub, tmp_path):
    """The real CLI, as a user without network runs it (HF_HUB_OFFLINE unset): one probe, then offline (a clear error,
    not a minute of huggingface_hub's retries: no second connection)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_HOME=str(tmp_path / "hf"))
    done = subprocess.run([sys.executable, "-m", "lit_embed.commands", "fit", "--config",
                           str(CONFIGS / "experiments" / "sparse_coding" / "mrpc.yaml"), "--trainer.max_steps", "1"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "does not answer: working offline" in done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("lit-embed: error: could not load pretrained encoder 'distilbert-base-uncased'")
    assert "hf download distilbert-base-uncased --local-dir DIR" in error and "HF_HUB_OFFLINE=1" in error
    assert len(silent_hub) == 1, silent_hub  # the probe; huggingface_hub, offline after it, asked nothing
