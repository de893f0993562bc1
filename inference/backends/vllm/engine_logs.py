"""What of the engine's own output reaches a command's output: judgestore's summary, unless ``-v`` asks for more.

Contract:

* :func:`quiet_engine` is called by the commands that may load vLLM
  (``generate``, ``judge``, ``audit``, ``adopt``) unless ``-v``/``--verbose``
  was given, before vLLM or torch is imported. It keeps out vLLM's log below
  ERROR, torch's (the Python ``torch`` loggers and the C++ ``c10`` log, e.g.
  "Triton not available", "NUMA binding"), the weight-loading progress bars
  (tqdm) and the warnings vLLM, torch and transformers raise (deprecations;
  in the engine core's own process too, through ``PYTHONWARNINGS``).
  Errors still show. An environment variable the user set wins: each is only
  set when absent.
  vLLM's own weight-loading bar is turned off where the engine is built
  (:func:`inference.backends.vllm.backend.create_vllm_backend` asks :func:`engine_is_quiet`).
  The ``-v``/``--verbose`` option is the command line's
  (:data:`inference.cli.options.VerboseOption`).
* It changes this process only (environment and warning filters); a Python
  caller of :mod:`inference` keeps vLLM's defaults unless it calls it.
"""

import os
import warnings

ENGINE_QUIET_ENV = {
    "VLLM_LOGGING_LEVEL": "ERROR",  # vLLM's own logger
    "TORCH_CPP_LOG_LEVEL": "ERROR",  # c10's log, read when torch loads (the NUMA binding warning)
    "TORCH_LOGS": "-all",  # torch's Python loggers at ERROR ("Triton not available")
    "TQDM_DISABLE": "1",  # progress bars of the libraries below vLLM (tqdm reads it when first imported)
    # The engine core's own process (vLLM's default) imports vLLM and torch again, without this process's warning
    # filters: their deprecations reached stderr, `--json` runs' too (was). Read by that process when it starts.
    "PYTHONWARNINGS": "ignore::DeprecationWarning,ignore::FutureWarning",
}
ENGINE_MODULES = r"(vllm|torch|transformers|triton)(\.|$)"

_quiet = False


def quiet_engine() -> None:
    """Keep the engine's log below ERROR, its progress bars and its warnings out of this process's output."""
    global _quiet
    _quiet = True
    for name, value in ENGINE_QUIET_ENV.items():
        os.environ.setdefault(name, value)
    warnings.filterwarnings("ignore", module=ENGINE_MODULES)


def engine_is_quiet() -> bool:
    """Whether :func:`quiet_engine` was called in this process."""
    return _quiet
