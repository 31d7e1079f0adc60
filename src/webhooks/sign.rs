//! Standard Webhooks signatures: base64 of HMAC-SHA256 over
//! `{id}.{timestamp}.{body}`, keyed with the secret's bytes (the base64
//! after `whsec_`).

use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

pub fn signature(secret: &str, id: &str, timestamp: i64, body: &str) -> Result<String, String> {
    let key = base64::engine::general_purpose::STANDARD
        .decode(secret.strip_prefix("whsec_").unwrap_or(secret))
        .map_err(|_| "the webhook secret is not base64".to_owned())?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).map_err(|e| e.to_string())?;
    mac.update(format!("{id}.{timestamp}.{body}").as_bytes());
    Ok(base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of the Standard Webhooks specification.
    #[test]
    fn matches_the_specifications_example() {
        let got = signature(
            "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1614265330,
            r#"{"test": 2432232314}"#,
        )
        .unwrap();
        assert_eq!(got, "g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }
}
