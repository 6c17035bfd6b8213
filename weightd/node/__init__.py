"""The node's operations, once (design §1, §3): what the daemon's routes and the in-process CLI both call.

- :mod:`.service`: ``NodeService`` (publish, preload, path, status, pin, unpin, evict, gc, verify);
- :mod:`.requests`: what a request may say, checked alike for the CLI and the daemon (``PreloadRequest``);
- :mod:`.outcomes`: what each preload's outcome counts (metrics, recent fallbacks and failures, time to ready);
- :mod:`.local`: the one place the configuration becomes tiering's runtime objects;
- :mod:`.swarm`: the adapter to ``p2p`` (``P2PConfig`` from the config, seeding what the node holds);
- :mod:`.sets`, :mod:`.companion`, :mod:`.hold`: LoRA sets, companion artefacts, ``weightd hold``;
- :mod:`.pressure`, :mod:`.ready_times`, :mod:`.diskbench`: what the node measures of itself.
- :mod:`.network`: weight traffic yields the link to serving traffic (``[network]``, ``NetworkYield``);
  :mod:`.network_routes`: which interfaces carry weightd's traffic (the routes to its peers, trackers and cold storage).
"""
