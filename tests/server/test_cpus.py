"""usable_cpus: the affinity of this process, capped by its cgroup's CPU quota, read
from cgroup trees laid out as cgroup v2 and v1 mount them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from blockx_server.runtime.cpus import cgroup_cpu_quota, usable_cpus

AFFINITY = len(os.sched_getaffinity(0))


def tree(root: Path, self_cgroup: str, files: dict[str, str]) -> Path:
    """A cgroup mount at ``root`` with ``files``; returns the /proc/self/cgroup file."""
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    listing = root.parent / "self-cgroup"
    listing.write_text(self_cgroup)
    return listing


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        ({"kube/pod/cpu.max": "150000 100000\n"}, 1.5),
        ({"kube/pod/cpu.max": "max 100000\n"}, None),
        # A limit above the process's own cgroup counts: the least one wins.
        ({"kube/pod/cpu.max": "max 100000\n", "kube/cpu.max": "50000 100000\n"}, 0.5),
        ({"kube/pod/cpu.max": "400000 100000\n", "kube/cpu.max": "200000 100000\n"}, 2.0),
        # A container that mounts its own cgroup as the root.
        ({"cpu.max": "300000 100000\n"}, 3.0),
        ({"kube/pod/cpu.max": "lots\n"}, None),
        ({"kube/pod/cpu.max": "100 0\n"}, None),
        ({}, None),
    ],
)
def test_cgroup_v2(tmp_path: Path, files: dict[str, str], quota: float | None) -> None:
    root = tmp_path / "cgroup"
    listing = tree(root, "0::/kube/pod\n", files)
    assert cgroup_cpu_quota(root, listing) == quota


@pytest.mark.parametrize(
    ("files", "quota"),
    [
        (
            {
                "cpu,cpuacct/docker/c1/cpu.cfs_quota_us": "50000\n",
                "cpu,cpuacct/docker/c1/cpu.cfs_period_us": "100000\n",
            },
            0.5,
        ),
        # Where the hierarchy is mounted as "cpu" (a link to "cpu,cpuacct" on most hosts).
        (
            {
                "cpu/docker/c1/cpu.cfs_quota_us": "250000\n",
                "cpu/docker/c1/cpu.cfs_period_us": "100000\n",
            },
            2.5,
        ),
        (
            {
                "cpu/docker/c1/cpu.cfs_quota_us": "-1\n",
                "cpu/docker/c1/cpu.cfs_period_us": "100000\n",
            },
            None,
        ),
        ({"cpu/docker/c1/cpu.cfs_quota_us": "50000\n"}, None),  # no period: no limit read
    ],
)
def test_cgroup_v1(tmp_path: Path, files: dict[str, str], quota: float | None) -> None:
    root = tmp_path / "cgroup"
    listing = tree(root, "5:memory:/docker/c1\n4:cpu,cpuacct:/docker/c1\n", files)
    assert cgroup_cpu_quota(root, listing) == quota


def test_no_cgroup_listing_means_no_limit(tmp_path: Path) -> None:
    assert cgroup_cpu_quota(tmp_path, tmp_path / "missing") is None
    assert usable_cpus(tmp_path, tmp_path / "missing") == AFFINITY


def test_the_quota_caps_the_affinity_rounded_up(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    listing = tree(root, "0::/\n", {"cpu.max": "50000 100000\n"})
    assert usable_cpus(root, listing) == 1  # half a CPU still runs one process
    (root / "cpu.max").write_text(f"{100000 * (AFFINITY + 5)} 100000\n")
    assert usable_cpus(root, listing) == AFFINITY  # a quota above the CPUs it may run on


def test_this_machine() -> None:
    assert 1 <= usable_cpus() <= AFFINITY
