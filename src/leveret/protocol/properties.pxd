# What the compiled channel calls in protocol/properties.py as C functions (see
# broker/message.pxd); the rest of the module is compiled as it is.

cpdef Py_ssize_t publish_flags(bytes payload) except -1
