# What protocol/methods.py needs of C when compiled (see broker/message.pxd): the
# delivery framing writes its bytes straight into a new bytes object. Only the
# `if cython.compiled` part of deliver_frames uses these names.

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.string cimport memcpy

cpdef bytes deliver_frames(
    Py_ssize_t channel,
    bytes ctag_prefix,
    unsigned long long delivery_tag,
    bint redelivered,
    bytes exchange_and_key,
    bytes header,
    bytes body,
)
