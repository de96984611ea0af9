"""The chaos drill's out-of-process executor: the example wire executor served as ``drill-wire``.

Started by bench/chaos_drill.py as ``[executors.drill-wire] command = [python, this file,
<drill prefix>]`` (the prefix only marks the program's processes for the drill's orphan check).
Its jobs are detached (``DetachedJobs``), so they outlive a SIGKILLed daemon and its program,
and the restarted program finds them again by their launch marker. Needs the example package
``conduit-example-wire`` (installed by ``CONDUIT_TEST_PLUGINS=1 scripts/setup.sh``).
"""

from __future__ import annotations

from conduit_example_wire import Config, JobData, WireExample

from conduit_core.extension import wire

MANIFEST = wire.manifest_for(
    name="drill-wire", generation=1, pool="jobs", capabilities=["stop", "interrupt"],
    config_type=Config, result_data=JobData,
)  # fmt: skip

if __name__ == "__main__":
    wire.serve(MANIFEST, {1: WireExample()}, result_data=JobData)
