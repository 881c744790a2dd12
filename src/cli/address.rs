//! The address of a running sidecar (`apply --addr`, `status
//! --http-addr`): `host:port`, where the host is an IP address (`[…]` for
//! IPv6) or a DNS name (`localhost`, `sidecar.ns.svc`). A name is kept as
//! given, so it is resolved when connecting and, over TLS, is the name the
//! sidecar's certificate is checked against.

/// Checks `text` as `host:port` and returns it as given.
pub fn parse(text: &str) -> Result<String, String> {
    if text.contains("://") {
        return Err(format!(
            "expected host:port, without a scheme (got `{text}`; TLS is asked for with --tls-ca or --tls-cert)"
        ));
    }
    if text.parse::<std::net::SocketAddr>().is_ok() {
        return Ok(text.to_string());
    }
    let Some((host, port)) = text.rsplit_once(':') else {
        return Err(format!("expected host:port, got `{text}` (no port)"));
    };
    match port.parse::<u16>() {
        Ok(port) if port > 0 => {}
        _ => {
            return Err(format!(
                "expected host:port, got `{text}` (`{port}` is not a port)"
            ))
        }
    }
    if !is_dns_name(host) {
        return Err(format!(
            "expected host:port, got `{text}` (`{host}` is neither an IP address nor a DNS name; \
             an IPv6 address goes in brackets: [::1]:{port})"
        ));
    }
    Ok(text.to_string())
}

/// A DNS name: dot-separated labels of ASCII letters, digits, `-` and `_`
/// (as in `_grpc._tcp` names), none empty, 253 bytes at most.
fn is_dns_name(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 253
        && host.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_addresses_and_dns_names_with_a_port() {
        for good in [
            "127.0.0.1:3500",
            "[::1]:50001",
            "localhost:3500",
            "sidecar.ns.svc:50001",
            "sidecar.ns.svc.cluster.local:50001",
        ] {
            assert_eq!(parse(good).as_deref(), Ok(good));
        }
        for (bad, why) in [
            ("localhost", "no port"),
            ("localhost:", "is not a port"),
            ("localhost:0", "is not a port"),
            ("localhost:70000", "is not a port"),
            (":3500", "neither an IP address nor a DNS name"),
            ("::1:3500", "neither an IP address nor a DNS name"),
            ("side car:3500", "neither an IP address nor a DNS name"),
            ("a..b:3500", "neither an IP address nor a DNS name"),
            ("http://localhost:3500", "without a scheme"),
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains(why), "{bad}: {err}");
        }
    }
}
