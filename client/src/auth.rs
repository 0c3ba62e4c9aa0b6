//! The bearer token every call carries, through one interceptor. The token may be set after the
//! client is made (a nodelet gets its credential at join): clones share it.

use std::sync::{Arc, RwLock};

use tonic::Status;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// Adds `authorization: Bearer TOKEN` to every call (nothing while there is no token).
#[derive(Clone, Default)]
pub struct Bearer(Arc<RwLock<Option<MetadataValue<Ascii>>>>);

impl Bearer {
    /// A bearer carrying `token` (surrounding whitespace dropped); None: no credentials.
    pub fn new(token: Option<&str>) -> Bearer {
        let b = Bearer::default();
        b.set(token);
        b
    }

    /// Carry `token` from now on, in this bearer and all its clones. A token that cannot be a
    /// header value (control characters) is dropped: the server then answers UNAUTHENTICATED.
    pub fn set(&self, token: Option<&str>) {
        let value = token.and_then(|t| format!("Bearer {}", t.trim()).parse().ok());
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = value;
    }

    /// Whether calls carry a token.
    pub fn has_token(&self) -> bool {
        self.0.read().unwrap_or_else(|e| e.into_inner()).is_some()
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(v) = self.0.read().unwrap_or_else(|e| e.into_inner()).as_ref() {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A channel whose calls carry the token.
pub type AuthChannel = InterceptedService<Channel, Bearer>;

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    #[test]
    fn clones_share_a_token_set_later() {
        let b = Bearer::default();
        let mut clone = b.clone();
        assert!(!b.has_token());
        b.set(Some(" tbnode-x \n"));
        let req = clone.call(tonic::Request::new(())).expect("intercepted");
        assert_eq!(
            req.metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok()),
            Some("Bearer tbnode-x")
        );
    }
}
