//! The outbound HTTP(S) client for what is not the GitHub REST API (a scale set's Actions service
//! and message queue, the runner package download, the relay subscription, webhook
//! notifications): rustls with the host's root certificates and HTTP/1, the same TLS stack
//! octocrab links, so no second one (and no OpenSSL) is built. It lives here, the lowest crate
//! that needs it (the scale sets' service client), and `rm_runner::https` re-exports it, so that
//! every user has this one rather than a copy of its own.

use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// A client sending bodies of type `B`, to `http://` and `https://` URLs.
pub type HttpsClient<B> = Client<HttpsConnector<HttpConnector>, B>;

/// A new client; fails only when the host's root certificates cannot be loaded.
pub fn client<B>() -> std::io::Result<HttpsClient<B>>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
{
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_native_roots()?
        .https_or_http()
        .enable_http1()
        .build();
    Ok(Client::builder(TokioExecutor::new()).build(connector))
}
