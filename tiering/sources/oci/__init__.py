"""An OCI registry as the cold tier (design §14): ``oci://REGISTRY/PREFIX``, where NAME@VERSION is the
CNCF ModelPack artifact ``PREFIX/NAME:VERSION``.

By concern::

    client.py   RegistryClient: the registry, every request authenticated, counted, classified,
                retried, bounded; one keep-alive connection per worker thread
    auth.py     credentials as docker/podman keep them; the basic and bearer-token flows
    layout.py   a version as a ModelPack artifact (config, one layer per file, weightd's own layers);
                NAME@VERSION <-> repository:tag, escaped where a registry could not hold it
    importer.py an artifact made elsewhere (ModelPack raw or tar layers, a KitOps ModelKit) pulled,
                every blob checked, to be published as a directory
    unpack.py   the import's scratch tree and its tar layers unpacked in bounded memory, every hostile
                entry or header refused in one line
    catalog.py  names, versions, a version's artifact and manifest (every blob checked by sha256)
    ranged.py   the registry's ranged GET for the shared core (tiering/sources/ranged/: a version's
                files in ranges, each part hashed as it arrives, resuming) and each blob's sha256
    publish.py  the blobs (skipped when present), weightd's manifest, the OCI manifest last
    cold.py     OciCold: the cold tier the tier code holds, made of the above

Guarantees: a version exists when its tag exists (the OCI manifest is pushed last); a tag holding
other content is never overwritten (short of two publishers racing, where the last PUT wins and
the other is told: publish.py), nor followed once read (versions are immutable); every byte is
checked as it arrives, against weightd's manifest (xxh3-128 per part) and the blob's digest (sha256).
"""
