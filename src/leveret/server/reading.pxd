# The C layout of server/reading.py's classes when compiled. Every read of every
# connection goes through SharedReadBuffer.place/take and ReadSizer.update; as C
# types, compiled ConnectionIO calls them without a Python frame.

cdef class SharedReadBuffer:
    cdef object _view
    cdef Py_ssize_t _size
    cdef object _placed
    cdef Py_ssize_t _start

    cpdef object place(self, bytes pending, Py_ssize_t want)
    cpdef bytes take(self, Py_ssize_t nbytes)


cdef class ReadSizer:
    cdef public Py_ssize_t offer

    cpdef update(self, Py_ssize_t nbytes, Py_ssize_t messages)
