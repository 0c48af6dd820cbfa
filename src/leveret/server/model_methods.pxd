# Compiled, the channel is one C type built in three layers (docs/architecture.md#the-
# compiled-hot-path): ModelMethods <- PublishMethods (server/publishing.pxd, the publish
# side's state) <- Channel (server/channel.pxd, the delivery side's). This layer has no
# state of its own; its handlers read the channel's attributes by name.

cdef class ModelMethods:
    pass
