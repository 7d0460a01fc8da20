//! Why `lifeguard inject` stopped: where in the manifest ([`Place`]s,
//! outermost first) and what is wrong there ([`ManifestFault`]), read as
//! `document 1: Pod web: container app: readinessProbe: the port "web" is
//! not one of the container's named ports`.

use std::fmt;
use std::path::PathBuf;

use lifeguard_base::settings::NotABool;
use lifeguard_istio::probers::{ProbeSpecError, ProbersError};
use lifeguard_istio::proxy_config::ProxyConfigError;

/// Why `lifeguard inject` stopped, and where.
#[derive(Debug, thiserror::Error)]
#[error("{}{fault}", Where(at))]
pub struct InjectError {
    /// Where, outermost first; none for the manifest as a whole.
    pub at: Vec<Place>,
    pub fault: ManifestFault,
}

impl InjectError {
    /// The same fault, found inside `place`.
    pub(super) fn within(mut self, place: Place) -> InjectError {
        self.at.insert(0, place);
        self
    }
}

impl From<ManifestFault> for InjectError {
    fn from(fault: ManifestFault) -> InjectError {
        InjectError { at: Vec::new(), fault }
    }
}

impl From<ProbeSpecError> for InjectError {
    fn from(e: ProbeSpecError) -> InjectError {
        ManifestFault::Probe(e).into()
    }
}

/// A place in the manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Place {
    /// The manifest's file; `None` is stdin.
    Input(Option<PathBuf>),
    /// A YAML document, from 1.
    Document(usize),
    /// An item of a `List`, from 1.
    ListItem(usize),
    /// An object: `Pod web`, `Deployment (no name)`.
    Object {
        kind: String,
        name: Option<String>,
    },
    Container(String),
    /// A container's field: `readinessProbe`, `lifecycle.preStop`, or a
    /// probe's handler (`httpGet`).
    Field(String),
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Place::Input(Some(path)) => write!(f, "{}", path.display()),
            Place::Input(None) => f.write_str("stdin"),
            Place::Document(n) => write!(f, "document {n}"),
            Place::ListItem(n) => write!(f, "List item {n}"),
            Place::Object { kind, name } => write!(f, "{kind} {}", name.as_deref().unwrap_or("(no name)")),
            Place::Container(name) => write!(f, "container {name}"),
            Place::Field(field) => f.write_str(field),
        }
    }
}

/// The places, each followed by `: `.
struct Where<'a>(&'a [Place]);

impl fmt::Display for Where<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|place| write!(f, "{place}: "))
    }
}

/// What is wrong in the manifest (or with reading it).
#[derive(Debug, thiserror::Error)]
pub enum ManifestFault {
    #[error("{0}")]
    Read(std::io::Error),
    #[error("not YAML: {0}")]
    NotYaml(serde_norway::Error),
    /// YAML that does not read as what it should be (a handler), or that
    /// cannot be written back.
    #[error("{0}")]
    Yaml(serde_norway::Error),
    /// The fields where the kind keeps its pod, missing.
    #[error("no pod template at {0}")]
    NoPodTemplate(String),
    #[error("the pod has no spec")]
    NoSpec,
    /// A label or annotation that should be a boolean: its section
    /// (`labels`, `annotations`), key and text.
    #[error("the {section} {key}: {text:?}: {why}")]
    NotABool {
        section: &'static str,
        key: &'static str,
        text: String,
        why: NotABool,
    },
    #[error("no proxy container: no container runs lifeguard; add one, or name it with --proxy-container")]
    NoProxy,
    #[error("no proxy container: no container is named {0:?}")]
    NoContainerNamed(String),
    /// The containers that all run lifeguard.
    #[error("several containers could be the proxy ({}): name it with --proxy-container", .0.join(", "))]
    SeveralProxies(Vec<String>),
    /// Istio's status-port annotation and the proxy's own port (and where
    /// that came from) disagree.
    #[error(
        "the annotation {annotation} says {annotated}, but the proxy's status port is {port} ({from}); \
         make them agree, or pass --status-port"
    )]
    StatusPortDisagrees {
        annotation: &'static str,
        annotated: u16,
        port: u16,
        from: &'static str,
    },
    #[error("the annotation {annotation}: {text:?} is not a port")]
    StatusAnnotation { annotation: &'static str, text: String },
    /// The proxy's status address (and where it came from) has no port.
    #[error("the proxy's status address {addr:?} ({from}) has no port; pass --status-port")]
    StatusAddr { addr: String, from: &'static str },
    #[error("the proxy container's {0}")]
    ProxyConfig(ProxyConfigError),
    /// The proxy container's env variable of app probes, refused.
    #[error("the proxy container's {env}: {error}")]
    Probers { env: &'static str, error: ProbersError },
    #[error("no port")]
    NoPort,
    #[error("the port {0:?} is not one of the container's named ports")]
    UnknownPort(String),
    #[error(transparent)]
    Probe(ProbeSpecError),
}
