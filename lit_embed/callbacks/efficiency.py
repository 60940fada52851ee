"""Time per sample and peak memory, measured the way HashFormers' Table 3 defines them."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities.data import extract_batch_size

from lit_embed.errors import ConfigError
from lit_embed.models.base import EmbeddingModule
from lit_embed.runs.results import load_average, load_over

#: ``ru_maxrss`` is in kibibytes on Linux and in bytes on macOS.
_RSS_UNIT = 1 if sys.platform == "darwin" else 1024


def peak_rss_bytes() -> int | None:
    """This process's peak resident set size: Linux's VmHWM, its own since exec, where ``ru_maxrss``
    starts from the parent's at fork (a DDP rank launched by a large rank 0 would report rank 0's)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:  # not Linux
        pass
    try:
        import resource
    except ImportError:  # Windows
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * _RSS_UNIT


def reset_peak_rss() -> bool:
    """Start this process's peak resident set size again from what it holds now (Linux: ``5`` to ``clear_refs``), so
    that a run in a process that ran others before it (``lit-embed sweep --launcher inline``) reports its own peak;
    ``False`` where it cannot (the peak then counts from the process's start)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


#: Dense bf16/fp16 tensor-core peak of a GPU, in TFLOP/s (no sparsity), by the first name fragment its device name holds.
PEAK_TFLOPS = (("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("H800", 989.4), ("A100", 312.0),
               ("A800", 312.0), ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0), ("V100", 125.0), ("T4", 65.0))


def peak_tflops(device_name: str) -> float | None:
    """The device's dense 16-bit peak from :data:`PEAK_TFLOPS`; ``None`` where the table does not know it (CPUs)."""
    return next((peak for fragment, peak in PEAK_TFLOPS if fragment in device_name), None)


class _Timer:
    """Seconds, samples and tokens (positions, padding included) of the measured steps of one kind (after ``warmup``
    unmeasured ones), and on a GPU the CUDA events of the steps not yet read."""

    def __init__(self) -> None:
        self.seen = 0
        self.steps = 0
        self.samples = 0
        self.tokens = 0
        self.flops = 0.0
        self.seconds = 0.0
        self.started: Any = None  # a clock reading, or a CUDA event
        self.batch_size = 0
        self.batch_tokens = 0
        self.pending: list[tuple[Any, Any]] = []


class EfficiencyMonitor(pl.Callback):
    """Time per sample of training and inference steps, and peak memory.

    * training: forward + backward of each step (from the batch's arrival on the device to the end
      of its backward pass; the optimiser step is left out, as in HashFormers' "PT" time);
    * inference: the forward pass of each validation, test and predict step (sanity checks excluded);
    * the first ``warmup_steps`` steps of each kind are not measured (allocator, kernel selection);
    * on a GPU each step is timed by CUDA events recorded on its stream, read when the GPU has passed them (no
      synchronisation per step: the host runs ahead while the device works); the time is the device's;
    * tokens per second count the positions of the batches' ``codes`` (padding included), and on a lit-embed
      model the model FLOPs utilisation ``mfu``: the transformer's FLOPs by formula
      (:meth:`~lit_embed.models.Encoder.training_flops_per_token`) over the time and the device's dense 16-bit peak
      (:data:`PEAK_TFLOPS`; ``None``, with the reason, where it is not known, as on a CPU);
    * peak memory: CUDA's maximum allocated bytes since the run started, else the process's peak
      resident set size since the run's setup (Linux; elsewhere since the process started, and said so),
      data-loading workers not included;
    * the machine's load: its 1-minute load average at the run's setup and when the figures are read, and its cores
      (``load``; rank 0's machine): a time measured beside other work is longer by it.

    Under DDP each rank times its own steps on its own batches; the figures sum seconds and samples
    over ranks, so ``ms_per_sample`` is the mean time one device spends per sample, and peak memory is
    the largest over ranks. Read them with :meth:`summary` (a collective: call it on every rank);
    :class:`~lit_embed.callbacks.ResultsWriter` logs them and writes them to ``results.json``.

    Args:
        warmup_steps: steps of each kind (training, inference) left out of the timing.
    """

    KINDS = ("train", "infer")
    #: The clock read before and after each measured step (a test may replace it).
    clock = staticmethod(time.perf_counter)

    def __init__(self, warmup_steps: int = 5) -> None:
        if warmup_steps < 0:
            raise ConfigError(f"warmup_steps={warmup_steps} must be 0 or more")
        self.warmup_steps = warmup_steps
        self.timers = {kind: _Timer() for kind in self.KINDS}
        self._device = torch.device("cpu")
        self._rss_from_start = True  # the peak counts from the run's setup (see reset_peak_rss)
        self._load_start: float | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._device = trainer.strategy.root_device
        if self._load_start is None:  # the first stage's (a fit's test keeps the fit's start)
            self._load_start = load_average()
        self._flops = pl_module.encoder.training_flops_per_token if isinstance(pl_module, EmbeddingModule) else None
        if self._device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self._device)
        else:
            self._rss_from_start = reset_peak_rss()

    # -- training steps --------------------------------------------------------------------------
    def on_train_batch_start(self, trainer, pl_module, batch: Any, batch_idx: int) -> None:
        self._start("train", batch)

    def on_after_backward(self, trainer, pl_module) -> None:
        self._stop("train")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._stop("train")  # steps without a backward pass (manual optimisation that skipped it)

    # -- inference steps -------------------------------------------------------------------------
    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        if not trainer.sanity_checking:
            self._start("infer", batch)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._stop("infer")

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._start("infer", batch)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._stop("infer")

    def on_predict_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._start("infer", batch)

    def on_predict_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._stop("infer")

    # -- measuring -------------------------------------------------------------------------------
    def _now(self) -> Any:
        """The clock's reading, or on a GPU an event recorded on the current stream."""
        if self._device.type != "cuda":
            return self.clock()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _start(self, kind: str, batch: Any) -> None:
        timer = self.timers[kind]
        timer.seen += 1
        timer.started = None
        if timer.seen <= self.warmup_steps:
            return
        timer.batch_size = extract_batch_size(batch)
        codes = batch.get("codes") if isinstance(batch, dict) else None
        rows, length = codes.shape[:2] if isinstance(codes, torch.Tensor) and codes.dim() >= 2 else (0, 0)
        timer.batch_tokens = rows * length
        if kind == "train" and timer.batch_tokens and self._flops is not None:
            timer.flops += timer.batch_tokens * self._flops(length)
        timer.started = self._now()

    def _stop(self, kind: str) -> None:
        timer = self.timers[kind]
        if timer.started is None:
            return
        end = self._now()
        if self._device.type == "cuda":
            timer.pending.append((timer.started, end))
            self._read(timer, wait=False)
        else:
            timer.seconds += end - timer.started
        timer.samples += timer.batch_size
        timer.tokens += timer.batch_tokens
        timer.steps += 1
        timer.started = None

    @staticmethod
    def _read(timer: _Timer, wait: bool) -> None:
        """Add the time of the steps whose events the GPU has passed (all of them, waiting, with ``wait``)."""
        while timer.pending and (wait or timer.pending[0][1].query()):
            start, end = timer.pending.pop(0)
            end.synchronize()
            timer.seconds += start.elapsed_time(end) / 1000.0

    def peak_memory_bytes(self) -> int | None:
        if self._device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self._device))
        return peak_rss_bytes()

    def summary(self, trainer: pl.Trainer) -> dict:
        """The figures so far, reduced over ranks (a collective: every rank must call it)."""
        for timer in self.timers.values():
            self._read(timer, wait=True)
        local = [x for kind in self.KINDS for x in self._local(kind)] + [float(self.peak_memory_bytes() or 0)]
        gathered = trainer.strategy.all_gather(torch.tensor(local, dtype=torch.float64, device=self._device))
        rows = gathered.reshape(-1, len(local)).cpu()
        totals = rows.sum(0)
        device = torch.cuda.get_device_name(self._device) if self._device.type == "cuda" else "cpu"
        peak = peak_tflops(device) if self._device.type == "cuda" else None
        figures: dict[str, Any] = {}
        for index, kind in enumerate(self.KINDS):
            seconds, samples, steps, tokens, flops = totals[5 * index : 5 * index + 5].tolist()
            figures[kind] = {
                "ms_per_sample": 1000.0 * seconds / samples if samples else None,
                "measured_steps": int(steps),
                "samples": int(samples),
                "warmup_steps": self.warmup_steps,
                "tokens_per_s": tokens / seconds if tokens and seconds else None,
            }
        seconds, flops = totals[0].item(), totals[4].item()
        figures["train"]["mfu"] = flops / seconds / (peak * 1e12) if flops and seconds and peak else None
        figures["mfu_basis"] = (
            "no lit-embed model: FLOPs unknown" if self._flops is None
            else f"transformer FLOPs (6 per weight + attention) over {device}'s dense 16-bit peak, {peak} TFLOP/s" if peak
            else f"no peak known for {device} (lit_embed.callbacks.efficiency.PEAK_TFLOPS)")
        figures["peak_memory_mb"] = float(rows[:, -1].max()) / 2**20 or None
        figures["memory"] = "cuda_max_allocated" if self._device.type == "cuda" else \
            "process_peak_rss" if self._rss_from_start else "process_peak_rss_since_process_start"
        figures["device"] = device
        figures["load"] = load_over(self._load_start)
        figures["world_size"] = int(rows.shape[0])
        figures["precision"] = str(trainer.precision)
        figures["reduction"] = "seconds, samples and tokens summed over ranks (per-device rates); peak memory the largest rank's"
        return figures

    def _local(self, kind: str) -> tuple[float, ...]:
        timer = self.timers[kind]
        return timer.seconds, float(timer.samples), float(timer.steps), float(timer.tokens), timer.flops
