//! Hostpath storage pools: volume create/delete/expand/snapshot/clone, capacity and quota (not yet built).
