//! A user's sidecar: the `rewire` command line, with one more component
//! type linked in. Every command sees it:
//!
//! ```sh
//! cargo run -- components                 # lists greeter/hello
//! cargo run -- validate --config greeter.json
//! cargo run -- run --config greeter.json  # edits of the file update it in place
//! ```

use rewire::components::LiveMetadata;
use rewire::prelude::*;
use serde::Deserialize;

/// The greeter's typed metadata.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
struct GreeterMetadata {
    /// What it says.
    greeting: String,
    /// To whom.
    #[serde(default = "everyone")]
    audience: String,
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
struct Greeter {
    #[metadata]
    meta: LiveMetadata<GreeterMetadata>,
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

fn main() -> std::process::ExitCode {
    rewire::main()
}
