//! A user's own component, in a library crate: `greeter/hello`. Both
//! binaries link it: `greeter-sidecar` (the whole `rewire` command line) and
//! `greeter-host` (a program hosting the runtime as a library).

use rewire::components::LiveMetadata;
use rewire::prelude::*;
use serde::Deserialize;

/// The greeter's typed metadata.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GreeterMetadata {
    /// What it says.
    pub greeting: String,
    /// To whom.
    #[serde(default = "everyone")]
    pub audience: String,
}

fn everyone() -> String {
    "everyone".to_string()
}

/// Greets its audience; takes a new greeting in place (`in_place`: the
/// derive finds the `InPlaceUpdate` impl below).
#[derive(rewire::Component)]
#[component(
    kind = "greeter",
    type = "hello",
    example = r#"{"greeting": "hello"}"#,
    in_place
)]
pub struct Greeter {
    #[metadata]
    meta: LiveMetadata<GreeterMetadata>,
}

impl Greeter {
    /// The greeting as it is now, e.g. `hello, everyone`.
    pub fn greeting(&self) -> String {
        let meta = self.meta.load();
        format!("{}, {}", meta.greeting, meta.audience)
    }
}

#[async_trait]
impl Component for Greeter {
    async fn init(&mut self, cx: &InitContext) -> Result<(), ComponentError> {
        let meta = self.meta.load();
        rewire::tracing::info!(component = %cx.key, greeting = %meta.greeting, audience = %meta.audience, "Greeter ready.");
        Ok(())
    }
}

#[async_trait]
impl InPlaceUpdate for Greeter {
    async fn update_in_place(&self, metadata: &Metadata) -> Result<InPlace, ComponentError> {
        // All of the change or none of it: decode first, then swap.
        let new: GreeterMetadata = metadata.decode()?;
        self.meta.replace(new);
        Ok(InPlace::Applied)
    }
}
