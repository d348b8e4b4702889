//! Upload server, upload proxy, upload tokens and the upload client (not yet built).
