//! A throw-away test CA and server certificate made with openssl. In progress.
