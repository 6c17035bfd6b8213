"""What :class:`tiering.node.LocalNode` is made of, one module per concern.

- :mod:`.roots`: the tier roots by descriptor (opened and checked once) and the lock files in them;
- :mod:`.catalog`: what is where (resolve, versions, published lookups, waiting for a publish);
- :mod:`.space`: usage, reservation (evicting by policy), eviction by admin and by watermark;
- :mod:`.staging`: a transfer on disk as an object (``open``, write, ``commit`` or ``abort``);
- :mod:`.sources`: where a preload's bytes come from (local reuse, delta, fetchers, cold);
- :mod:`.reconcile`: start-up recovery, adoption of unknown copies after verifying them;
- :mod:`.publish` and :mod:`.preload`: the two flows that compose the above;
- :mod:`.reports`: what the operations return (``PublishReport``, ``PreloadReport``, status).

Each concern is a small object built by ``LocalNode`` over the same :class:`~.roots.TierRoots` and
:class:`~tiering.state.State`; none of them imports another's internals, and only the preload flow
writes a :class:`~.reports.PreloadReport`.
"""
