//! The gRPC services a controller serves to users, nodelets and other controllers.

pub mod cluster;
pub mod objects;
