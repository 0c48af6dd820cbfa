# What workers/link.py needs of C when compiled (see broker/message.pxd): the record
# kinds and the length limit LinkReader.feed tests, as C integers (a test against a
# module constant would box the C integer first). Its classes stay Python classes.

cdef Py_ssize_t _C_PUBLISH
cdef Py_ssize_t _C_DELIVER
cdef Py_ssize_t _C_REPLY
cdef Py_ssize_t _C_MAX_PAYLOAD
