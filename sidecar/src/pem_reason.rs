//! PEM parse errors in fixed words, for the listener's TLS files and the
//! span exporter's.

/// Why a PEM text did not parse, in fixed words: the library's own
/// message can quote the offending line, which may be key material (also
/// used for the span exporter's files).
pub(crate) fn pem_error_reason(err: &rustls::pki_types::pem::Error) -> &'static str {
    use rustls::pki_types::pem::Error;
    match err {
        Error::MissingSectionEnd { .. } => "a PEM section has no `-----END` line",
        Error::IllegalSectionStart { .. } => "a PEM `-----BEGIN` line is malformed",
        Error::Base64Decode(_) => "a PEM section is not valid base64",
        Error::NoItemsFound => "no PEM section of the expected kind",
        _ => "the PEM text is malformed",
    }
}
