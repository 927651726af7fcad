"""Everything Ray: the executor of `--executor ray[:ADDRESS]`, the cluster's one limiter and
budget, very wide runs in chunks, and an evaluation's trials as Ray tasks.

`session/` defines what an executor is (`session.executor.Executor`) and never imports this
package; the interface layer builds one here (`executor_for`) and hands it to a session. Ray
itself is imported only inside functions (`cluster.ray`), when a command asked for it.

Nothing is imported here at the package's import: the limiter's actor process imports only its own
module (`cluster.actor`), and reaching it through this package must not bring in the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amapreduce.cluster.wide import RayExecutor
    from amapreduce.session.executor import Executor, ExecutorSpec

__all__ = ["RayExecutor", "executor_for"]


def __getattr__(name: str) -> Any:
    if name == "RayExecutor":
        from amapreduce.cluster.wide import RayExecutor

        return RayExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def executor_for(spec: ExecutorSpec | str | None, *, source: str = "--executor") -> Executor | None:
    """The executor a spec names (`local`, `ray`, `ray:ADDRESS`, or a parsed one): None for local
    (everything runs in this process), else a `RayExecutor` whose extra is checked. `source` is
    where a text spec came from (the flag, the variable, the API's keyword), for the refusal.

    Raises:
        ConfigError: a value that is not local, ray or ray:ADDRESS, or ray without the `ray` extra.
    """
    from amapreduce.cluster.wide import RayExecutor
    from amapreduce.session.executor import parse_executor

    if spec is None:
        return None
    parsed = parse_executor(spec, source=source) if isinstance(spec, str) else spec
    if parsed.kind == "local":
        return None
    executor = RayExecutor(parsed)
    executor.check()
    return executor
