"""Where a published version's bytes come from, one module per kind of source.

    base.py  the seam: FetchRequest in, FetchResult out (Fetcher); the P2P swarm implements it in p2p
    s3/      an object store as the cold tier (ObjectCold)
    oci/     an OCI registry as the cold tier (OciCold), and artifacts to import (publish oci://)
    ranged/  the ranged downloads both of those make (each gives only its GET)
    hf.py    a Hugging Face Hub repository to import (publish hf://): resolve, download, check hashes

A path cold tier needs no module here: it is a directory the tier code opens like the warm tier's
(tiering/store/roots.py) and copies from with the same checked copy (tiering/store/sources.py, which
chooses among the sources for one preload).
"""
