//! A user's own sequencer and file store, with the derive; a component
//! that injects both.
use rewire_runtime::prelude::*;
use rewire_runtime::Component;

#[derive(Component, Default)]
#[component(kind = "sequencer", type = "counting")]
struct CountingSequencer {
    last: std::sync::atomic::AtomicI64,
}

impl Component for CountingSequencer {}

#[async_trait]
impl Sequencer for CountingSequencer {
    async fn get_next_id(&self, _req: NextIdRequest) -> Result<i64, SequencerError> {
        Ok(self.last.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1)
    }
}

#[derive(Component, Default)]
#[component(kind = "file", type = "nowhere")]
struct NowhereFiles {}

impl Component for NowhereFiles {}

#[async_trait]
impl FileStore for NowhereFiles {
    async fn put(&self, req: PutFileRequest) -> Result<FileInfo, FileError> {
        Err(FileError::Invalid(format!("`{}`: read-only", req.name)))
    }
    async fn get(&self, name: &str) -> Result<FileRead, FileError> {
        Err(FileError::NotFound(name.into()))
    }
    async fn list(&self, _req: ListRequest) -> Result<ListPage, FileError> {
        Ok(ListPage::default())
    }
    async fn stat(&self, name: &str) -> Result<FileInfo, FileError> {
        Err(FileError::NotFound(name.into()))
    }
    async fn delete(&self, name: &str) -> Result<(), FileError> {
        Err(FileError::NotFound(name.into()))
    }
}

#[derive(Component, Default)]
#[component(kind = "orders", type = "numbered")]
struct Orders {
    #[inject]
    ids: SequencerHandle,
    #[inject]
    files: Option<FileStoreHandle>,
}

impl Component for Orders {}

fn main() {
    let registry = rewire_runtime::Registry::collected();
    assert!(registry.get("sequencer", "counting").is_some());
    assert!(registry.get("file", "nowhere").is_some());
    assert!(registry.get("orders", "numbered").is_some());
    let orders = Orders::default();
    assert!(!orders.ids.is_bound() && orders.files.is_none());
}
