"""How a target is loaded: which model, on which device, in which dtype, with which weights; stated and checked once.

`DEVICES`, `DTYPES` and `WEIGHTS` are the values each setting takes: the command line offers them as choices
(cli/options.py) and `LoadSettings` refuses anything else when it is made, with one line naming the setting
(`weights must be one of ...`). `with_environment` fills an `auto` dtype or weights from SPECDEC_DTYPE and
SPECDEC_WEIGHTS (defaults of one's own), checked the same way. Whether the values go together (block weights on
a CPU, a GGUF for `gguf`) needs the target and the machine: models.check_load decides that, still before anything
loads. Plain data and no heavy imports, so the CLI's help can name the choices without loading torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Mapping, Optional

from ...defaults import DEFAULT_TARGET
from ...errors import check_choice
from ..device import DECODERS

DEVICES = ("auto", "cpu", "cuda", "mps")
DTYPES = ("auto", "float32", "bfloat16", "float16")
WEIGHTS = ("auto", "dense", "gguf", "int8", "int4")  # what each means: target_model/native/quant.py
BLOCK_MODES = ("gguf", "int8", "int4")  # the weights that run on specdec's CPU kernels
ENVIRONMENT_DEFAULTS = {"dtype": "SPECDEC_DTYPE", "weights": "SPECDEC_WEIGHTS"}  # what `auto` means, if set


@dataclass(frozen=True)
class LoadSettings:
    """What `models.load_target` is asked for; each value checked when the settings are made."""

    target: str = DEFAULT_TARGET  # a name, a .gguf file, a model directory or a hub id (target_source.resolve_target)
    device: str = "auto"
    dtype: str = "auto"
    weights: str = "auto"
    decoder: str = "auto"  # auto: the device engine on cuda; device: the device engine wherever (device/)

    def __post_init__(self) -> None:
        check_choice(self.device, DEVICES, "device")
        check_choice(self.dtype, DTYPES, "dtype")
        check_choice(self.weights, WEIGHTS, "weights")
        check_choice(self.decoder, DECODERS, "decoder")

    def with_environment(self, environ: Optional[Mapping[str, str]] = None) -> "LoadSettings":
        """These settings with an `auto` dtype or weights replaced by SPECDEC_DTYPE or SPECDEC_WEIGHTS where set
        (read from `environ`, by default the process's environment, which is never changed)."""
        environ = os.environ if environ is None else environ
        chosen = {}
        for setting, variable in ENVIRONMENT_DEFAULTS.items():
            value = environ.get(variable, "").strip()
            if getattr(self, setting) == "auto" and value:
                chosen[setting] = check_choice(value, DTYPES if setting == "dtype" else WEIGHTS, setting,
                                               named=variable)
        return replace(self, **chosen) if chosen else self
