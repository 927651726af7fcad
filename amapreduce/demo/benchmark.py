"""The sandbox benchmark's simulated models for `amapreduce eval run --benchmark sandbox`.

Offline and keyless: trial k of every instance gets a fresh `SimulatedAtlasModel(sample=k-1)`
holding `BENCHMARK_CAPACITY_CELLS` cells per answer (the manager and the sub-agents: deterministic
code, not an LLM; `sample` stands for another sample of an LLM at temperature > 0) and the memory's projection and distillation are answered
by `SimulatedMemoryModel`. The evaluation runner (`amapreduce.bench.evaluate`) never imports
simulated models itself; the command line brings them from here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from amapreduce.bench.trial import SimulatedModels
    from amapreduce.session.parts import InnerFactory

__all__ = ["BENCHMARK_CAPACITY_CELLS", "sandbox_models"]

BENCHMARK_CAPACITY_CELLS = 24
"""Output cells a simulated sub-agent's answer holds in the sandbox benchmark (the demo's model holds
`amapreduce.demo.model.CAPACITY_CELLS`, 16). With 16 cells, the best fixed batching of every family
used 0.48 times memory-off's sub-agents per task on the second half of the benchmark: a learner had
to be perfect to save half of them. With 24 the best fixed batchings use 0.37 times, the best
batchings still differ by family (2 or 3 rows of the 7-cell `dossier` rows, 6 to 12 of the narrow
ones, by_attr for `leaders`), and explored oversized batches still lose rows (issue 24)."""


def sandbox_models() -> SimulatedModels:
    """The simulated models of one sandbox evaluation."""
    from amapreduce.bench.trial import SimulatedModels
    from amapreduce.demo.memory_model import SimulatedMemoryModel
    from amapreduce.demo.model import SimulatedAtlasModel
    from amapreduce.testing.scripted import SIMULATED_PRICES

    def inner_for(instance_id: str, trial: int) -> InnerFactory:
        model = SimulatedAtlasModel(sample=trial - 1, capacity_cells=BENCHMARK_CAPACITY_CELLS)
        return lambda role: model

    return SimulatedModels(inner_for=inner_for, memory_model=SimulatedMemoryModel(),
                           prices_by_prefix=SIMULATED_PRICES)
