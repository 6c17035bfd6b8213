"""Ranged downloads from a cold tier that is not a path: the one core of the object-store tier
(:mod:`tiering.sources.s3`) and the registry tier (:mod:`tiering.sources.oci`). Each tier gives
only its transport (``s3/ranged.py``: an obstore GET with If-Match; ``oci/ranged.py``: an HTTP GET
of a blob with Range, authenticated); everything else is here.

By concern::

    cut.py     a file's parts still wanted, cut into ranges of about equal size along its parts
    fetch.py   the download: ranges ``concurrency`` at a time, each part hashed (xxh3-128) as its
               bytes arrive, a failed range asked again from its start, the deadline; resuming;
               Transport, what a tier gives
    digest.py  a whole-file digest (SHA-256) taken in order while the ranges arrive out of order
"""
