"""atlas-iouring: the ``io_uring`` StorageBackend (see :mod:`atlas_iouring.storage`)."""
