//! A small HTTP fault server (resets, Content-Length lies, 503 storms, stalls). In progress.
