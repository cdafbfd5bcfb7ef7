"""The baselines' origins: a real registry and a wheel index, each in its own namespace.

A baseline start pulls its image from a registry and installs its requirements from a
package index; in the lab both sit behind capped links of their own, like the DataNodes,
so that what they serve to N nodes at once is measured, not assumed; and each runs in a
cgroup of its own (``LabSpec.origin_cgroup``), its CPU counted and capped apart.

* registry: Debian's ``docker-registry`` (distribution 2.8) with a filesystem store in
  ``STATE/registry/data``, plain HTTP on ``spec.registry_address`` (push with
  ``skopeo copy --dest-tls-verify=false``; engines call it insecure);
* wheel index: ``STATE/index`` served over HTTP (``python -m http.server``), in the layout
  of PEP 503: ``simple/<normalized project name>/<wheels>``. pip reads the directory
  listing's links as the project's page, so putting wheels there publishes them (plain
  HTTP: ``pip install --index-url URL --trusted-host 198.18.2.2``).
"""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

from bootseer_dev import netns
from bootseer_dev.cgroups import placed_argv
from bootseer_dev.cluster.process import ProcessRecord, launch, log_tail, why_not_running
from bootseer_dev.engines import registry_config

from .spec import INDEX_PORT, REGISTRY_PORT, LabSpec, Member
from .state import LabState

__all__ = ["OriginStartError", "index_dir", "start_origins"]


class OriginStartError(RuntimeError):
    """The registry or the index did not come up; the message has its log's tail."""


def index_dir(spec: LabSpec) -> Path:
    """The wheel index's root: wheels go in ``simple/<project>/``."""
    return spec.state_dir / "index"


def _listening(member: Member, port: int) -> bool:
    def connect() -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex((member.address, port)) == 0

    return netns.call_in(member.netns, connect)


def start_origins(spec: LabSpec, state: LabState, timeout_s: float = 60.0) -> None:
    """Start the registry and the index in their namespaces, record them, and wait (at
    most timeout_s) until each accepts connections on its lab address."""
    root = spec.state_dir / "registry"
    config = registry_config(root, spec.registry_address)
    (index_dir(spec) / "simple").mkdir(parents=True, exist_ok=True)
    # Each command line names this lab's state dir: the marker that proves a pid ours.
    plans = [(spec.registry, REGISTRY_PORT, root / "registry.log", str(config),
              ["docker-registry", "serve", str(config)]),
             (spec.index, INDEX_PORT, spec.state_dir / "index.log", str(index_dir(spec)),
              [sys.executable, "-m", "http.server", "--bind", spec.index.address,
               "--directory", str(index_dir(spec)), str(INDEX_PORT)])]
    started: list[tuple[Member, int, ProcessRecord]] = []
    for member, port, log, marker, argv in plans:
        placed = placed_argv(spec.origin_cgroup(member.role), member.netns)
        rec = launch(member.role, [*placed, *argv], log, marker)
        state.add(state.processes, rec)
        started.append((member, port, rec))
    deadline = time.monotonic() + timeout_s
    for member, port, rec in started:
        while not _listening(member, port):
            why = why_not_running(rec)
            if why or time.monotonic() > deadline:
                raise OriginStartError(f"{member.role} did not listen on {member.address}:"
                                       f"{port} ({why or f'{timeout_s:.0f}s'}); {rec.log}:\n"
                                       f"{log_tail(rec.log)}")
            time.sleep(0.1)
