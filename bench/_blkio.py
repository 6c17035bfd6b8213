"""A cgroup-v1 blkio child that caps reads from one device (``blkio.throttle.read_bps_device``): this
VM's disk is backed by host memory, so a cap emulates the contended device the seed reports describe.
Everything put in it (a command through :meth:`wrap`, a running process through :meth:`add`) shares
the one cap, as processes on a node share its disk. A no-op, saying why, when not root or without v1."""

from __future__ import annotations

import os

from _cgroup import V1Child


class Throttle(V1Child):
    controller, needs = "blkio", "blkio.throttle.read_bps_device"

    def __init__(self, device: tuple[int, int], bps: int) -> None:
        super().__init__()
        self.bps = bps
        if bps <= 0:
            self.why = "no cap asked for"
            return
        self.create({"blkio.throttle.read_bps_device": f"{device[0]}:{device[1]} {bps}"})

    @classmethod
    def for_path(cls, path: "os.PathLike[str] | str", bps: int) -> "Throttle":
        st = os.stat(path)
        return cls((os.major(st.st_dev), os.minor(st.st_dev)), bps)
