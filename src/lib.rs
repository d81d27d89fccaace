//! redlimit
