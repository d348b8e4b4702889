//! qcow2 reader (in progress).
