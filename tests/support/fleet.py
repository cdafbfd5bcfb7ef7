"""A fleet lab section written from simple formulas of our own (not the simulator's): what the
simulator is calibrated, validated and extrapolated from in the fleet simulator's tests."""

from __future__ import annotations


def synthetic_lab(counts: tuple[int, ...] = (1, 2, 4, 8, 16)) -> dict:
    """A lab section as bench-restart writes it, from simple formulas of our own (not the
    simulator's): each step's CPU seconds stretched by the cores' sharing, bytes at each
    node's share of its origin, a teardown after ready, and a 2% spread across nodes."""
    caps = {"node_Bps": 25e6, "datanode_Bps": 40e6, "registry_Bps": 40e6, "index_Bps": 40e6,
            "datanodes": 4, "cpus": 2}
    size = {"image_layers": 40_000_000, "image_lazy": 30_000_000, "image_hot": 25_000_000,
            "wheels": 19_000_000, "env_snapshot": 30_000_000, "checkpoint": 33_554_432}
    hdfs = caps["datanodes"] * caps["datanode_Bps"]

    def took(nbytes: float, share: float) -> float:
        return nbytes / min(caps["node_Bps"], share)

    def marks(case: str, n: int, i: int) -> dict[str, float]:
        cpu = max(1.0, (2 * n if case == "bootseer" else n) / caps["cpus"])
        steps: dict[str, float] = {}
        start = {"env": 1.2 * cpu, "started": 0.5 * cpu, "imported": 0.6 * cpu,
                 "checkpoint": 0.3 * cpu, "ready": 0.0}
        if case == "baseline":
            readers = len(range(i % 4, n, 4))  # one stream from DataNode i % 4
            steps = {"image": took(size["image_layers"], 40e6 / n) + 1.5 * cpu,
                     "env": took(size["wheels"], 40e6 / n) + 5.0 * cpu,
                     "started": 0.6 * cpu, "imported": 0.3 * cpu,
                     "checkpoint": took(size["checkpoint"], 40e6 / readers) + 0.2 * cpu,
                     "ready": 0.0}
        elif case == "bootseer_cold":
            steps = {"env": took(size["wheels"], 40e6 / n) + 5.5 * cpu
                     + took(size["env_snapshot"], hdfs / n),
                     "started": took(size["image_lazy"], hdfs / n) + 0.5 * cpu,
                     "imported": 0.6 * cpu,
                     "checkpoint": took(size["checkpoint"], hdfs / n) + 0.2 * cpu,
                     "ready": 0.0}
        elif case == "bootseer_prestaged":
            steps = start
        elif case == "bootseer_p2p":  # hot pack and snapshot from peers (the store's once)
            steps = {"staged": 0.4 * cpu + took(size["image_hot"] + size["env_snapshot"], hdfs)
                     + took(size["checkpoint"], hdfs / n)} | start
        jitter, t, out = 1 + 0.02 * i / n, 0.0, {}
        for name, seconds in steps.items():
            t += seconds * jitter
            out[name] = t
        if case == "bootseer":  # the warm stages the hot pack, the snapshot, the checkpoint,
            hot = took(size["image_hot"], hdfs / n) * jitter  # then works on them
            snapshot = hot + took(size["env_snapshot"], hdfs / n) * jitter
            fetched = snapshot + took(size["checkpoint"], hdfs / n) * jitter
            out["env"] = max(1.2 * cpu, snapshot) + 0.2
            out["started"] = out["env"] + 0.5 * cpu
            out["imported"] = out["started"] + 0.6 * cpu
            out["checkpoint"] = out["ready"] = max(out["imported"] + 0.3 * cpu, fetched)
            out["warm"] = fetched + 0.4 * cpu
        out["exited"] = out["ready"] + 0.3 * cpu
        return out

    def run(case: str, n: int) -> dict:
        nodes = [{"node": i, "marks": marks(case, n, i)} for i in range(n)]
        return {"nodes": nodes, "origin_bytes": {"registry": 4e7 * n}, "cpu_busy": 0.5,
                "wall_s": max(node["marks"]["exited"] for node in nodes)}

    cases = {case: {str(n): run(case, n) for n in counts}
             for case in ("baseline", "bootseer_cold", "bootseer_prestaged", "bootseer",
                          "bootseer_p2p")}
    return {"caps": caps, "per_node_bytes": size, "cases": cases}


#: What each phase's work grows with, per case (the marks' intervals): our own table, not
#: the simulator's ``scales_with``.
GROWS = {
    "baseline": {"image": ("image_layers",), "env": ("wheels",), "checkpoint": ("checkpoint",)},
    "bootseer_cold": {"env": ("wheels",), "started": ("image_lazy",),
                      "checkpoint": ("checkpoint",)},
    "bootseer_prestaged": {"env": ("env_snapshot",), "started": ("image_hot",),
                           "checkpoint": ("checkpoint",)},
    "bootseer": {"env": ("env_snapshot",), "started": ("image_hot",),
                 "checkpoint": ("checkpoint",)},
    "bootseer_p2p": {"staged": ("image_hot", "env_snapshot", "checkpoint"),
                     "env": ("env_snapshot",), "started": ("image_hot",),
                     "checkpoint": ("checkpoint",)},
}


def with_costs(lab: dict, scale: float = 1.0, fixed: float = 0.5,
               per_mb: float = 0.1) -> dict:
    """``lab`` with every artifact ``scale`` times as big and each node's phases (every
    mark but the teardown's) costing ``fixed`` core-seconds plus ``per_mb`` per MB of what
    the phase's work grows with (:data:`GROWS`), as a lab at a fixed CPU budget records
    them."""
    lab["per_node_bytes"] = {a: b * scale for a, b in lab["per_node_bytes"].items()}
    for case, by_n in lab["cases"].items():
        grows = GROWS[case]
        for run in by_n.values():
            for node in run["nodes"]:
                node["phases"] = {
                    mark: {"cpu_s": fixed + per_mb * sum(lab["per_node_bytes"][a]
                                                         for a in grows.get(mark, ())) / 1e6}
                    for mark in node["marks"] if mark not in ("exited", "warm")}
    return lab
