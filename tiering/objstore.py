"""The object-store cold tier's old module path, for tests that import it (the code is in
:mod:`tiering.sources.s3`)."""

from .sources.s3.client import (OBJECT_MANIFEST_LIMIT, ObjectChanged, ObjectLocation, ObjectStoreError,  # noqa: F401
                                StoreSetupError, shared_credentials)
from .sources.s3.cold import ObjectCold  # noqa: F401
from .sources.s3.ranged import groups as _groups  # noqa: F401
