# Compiled, the channel is one C type built in three layers
# (docs/architecture.md#the-compiled-hot-path): ModelMethods <- PublishMethods (server/publishing.pxd, the publish
# side's state) <- Channel (server/channel.pxd, the delivery side's). This layer has no
# state of its own but `closing`; its handlers read the channel's attributes by name.
# The connection's read loop (server/connection_io.pxd) types a channel as this
# layer: it cannot cimport the Channel, which cimports it (through publishing.pxd).
# So what that loop uses of every channel is declared here: `closing`, on_publish.

from leveret.protocol.events cimport Publish


cdef class ModelMethods:
    cdef public bint closing

    cpdef on_publish(self, Publish event)
