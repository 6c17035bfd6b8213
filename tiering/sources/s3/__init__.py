"""Object storage as the cold tier (design §14): ``s3://BUCKET/PREFIX`` holding the same layout as a
path cold tier (``NAME/VERSION/<files>``, ``NAME/VERSION/.weightd/manifest.json``).

By concern::

    client.py   S3Client: the bucket, credentials, every request counted, classified, retried, bounded
    catalog.py  names, versions, a version's manifest and the small objects beside it
    ranged.py   one ranged GET of an object, its ETag held (the download itself: tiering.sources.ranged)
    publish.py  the claim, the uploads (each part hashed as it is sent), the manifest last
    cold.py     ObjectCold: the cold tier the tier code holds, made of the above

Guarantees: a version exists when its manifest object exists (written last); one publisher wins
(see :mod:`.publish`); every byte is checked as it arrives, and an object replaced mid-download is an
error, never a mix of two versions (see :mod:`.ranged`).
"""
