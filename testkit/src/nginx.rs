//! nginx started on a free port with its own config. In progress.
