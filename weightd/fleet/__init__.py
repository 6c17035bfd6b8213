"""The fleet as the origin sees it, and a worker's calls to the origin (design §9).

- :mod:`.report`: a worker's report, checked field by field (it comes from the network);
- :mod:`.view`: the origin's view of what its workers hold, from their reports;
- :mod:`.ratelimit`: a per-address token bucket (reports an address may send a second);
- :mod:`.rollout`: the fleet-wide cap on rollout movers;
- :mod:`.client`: a worker's (and ``weightd fleet status``'s) calls to the origin's fleet endpoints.
"""
