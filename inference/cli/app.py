"""The whole ``judgestore`` command line: the store's commands and the inference layer's, in one app.

Contract:

* :func:`app` is the app :func:`store.cli.app.build_app` assembles, with the
  commands of :mod:`inference.cli.generate` (``generate``, ``judge``,
  ``pairs``), :mod:`inference.cli.legacy` (``import``),
  :mod:`inference.cli.diagnostics` (``explain``, ``audit``) and
  :mod:`inference.cli.adopt` (``adopt``) registered into it; the last two are
  given the model options of :mod:`inference.cli.options`. :mod:`store` knows nothing of inference.
* :func:`main` is the ``judgestore`` console script (``inference.cli:main``
  resolves to it).
"""

import typer

from inference.cli import adopt, diagnostics, generate, legacy, options
from store.cli.app import build_app, run_program


def app() -> typer.Typer:
    """The whole ``judgestore`` command line: the store's commands and the inference layer's."""
    return build_app(
        generate.register,
        legacy.register,
        diagnostics.registrar(options.model_spec),
        adopt.registrar(options.model_spec),
    )


def main() -> None:
    """The ``judgestore`` console script (:func:`store.cli.app.run_program`: it ends the process when done)."""
    run_program(app())
