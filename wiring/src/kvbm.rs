//! KV block tiers a service asks for with Dynamo KVBM's variables, in its env as Dynamo
//! users write them (`research/pillars.md` 3.1), and the sidecar flags they become
//! (`DESIGN.md`, "KV blocks in the sidecar"): G2 host memory, G3 local disk, G4 S3
//! object storage, held by the sidecar's block store rather than by the engine.
//!
//! Sizes are gigabytes of 10^9 bytes, as Dynamo counts them: its KVBM leader turns
//! `DYN_KVBM_{CPU,DISK}_CACHE_GB` into blocks with `cache_size_gb * 1_000_000_000.0 /
//! bytes_per_block` (`compute_num_blocks` of its Python bindings' block manager leader,
//! parsed as a float, so `0.5` is allowed).
//! Dynamo sizes its object tier in blocks (`DYN_KVBM_OBJECT_NUM_BLOCKS`); a block's bytes
//! depend on the model and engine, which the operator does not know, so the object tier
//! is sized with a variable of our own, `DYNAMO_KVBM_OBJECT_CACHE_GB` (also read under its
//! first name, `DYN_KVBM_OBJECT_CACHE_GB`), and every `*_NUM_BLOCKS`
//! variable is refused with the one to use instead. Where Dynamo reads a bad value as 0
//! (no tier), the operator refuses it.

use std::collections::BTreeMap;

use dynamo_crds::{ComponentSpec, DynamoGraphDeploymentSpec, ServiceRole};
use k8s_openapi::api::core::v1::EnvVar;

const CPU_CACHE_GB: &str = "DYN_KVBM_CPU_CACHE_GB";
const DISK_CACHE_GB: &str = "DYN_KVBM_DISK_CACHE_GB";
const DISK_CACHE_DIR: &str = "DYN_KVBM_DISK_CACHE_DIR";
/// Dynamo offloads a block from CPU to disk only once it was reused (frequency >= 2);
/// `true` offloads every block (Dynamo's `pass_all` policy).
const DISABLE_DISK_OFFLOAD_FILTER: &str = "DYN_KVBM_DISABLE_DISK_OFFLOAD_FILTER";
const OBJECT_ENABLED: &str = "DYN_KVBM_OBJECT_ENABLED";
const OBJECT_BUCKET: &str = "DYN_KVBM_OBJECT_BUCKET";
const OBJECT_ENDPOINT: &str = "DYN_KVBM_OBJECT_ENDPOINT";
const OBJECT_REGION: &str = "DYN_KVBM_OBJECT_REGION";
/// Ours, not Dynamo's: the object tier's capacity, in the same gigabytes as the others.
const OBJECT_CACHE_GB: &str = "DYNAMO_KVBM_OBJECT_CACHE_GB";
/// [`OBJECT_CACHE_GB`]'s first name, read when it is unset.
const OBJECT_CACHE_GB_OLD: &str = "DYN_KVBM_OBJECT_CACHE_GB";

/// Dynamo's block-count sizes, and the variable in bytes that replaces each.
const BLOCK_COUNTS: [(&str, &str); 3] = [
    ("DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS", CPU_CACHE_GB),
    ("DYN_KVBM_DISK_CACHE_OVERRIDE_NUM_BLOCKS", DISK_CACHE_GB),
    ("DYN_KVBM_OBJECT_NUM_BLOCKS", OBJECT_CACHE_GB),
];

/// The S3 client's own variables (object_store's `AmazonS3Builder::from_env`), which
/// the sidecar reads; the service's own `AWS_*` (credentials) are passed to it as well.
const AWS_ENDPOINT_URL: &str = "AWS_ENDPOINT_URL";
const AWS_REGION: &str = "AWS_REGION";
const AWS_ALLOW_HTTP: &str = "AWS_ALLOW_HTTP";

/// Whether a variable of the engine's env also belongs in its sidecar's when the object
/// tier is on (credentials, profile, web identity).
pub fn for_object_client(name: &str) -> bool {
    name.starts_with("AWS_")
}

/// The tiers of one engine service.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Kvbm {
    /// G2 capacity in bytes; 0: no host tier.
    pub host_bytes: u64,
    pub disk: Option<DiskTier>,
    pub object: Option<ObjectTier>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskTier {
    pub bytes: u64,
    /// `DYN_KVBM_DISK_CACHE_DIR`: where a pod's sidecar keeps the files (Dynamo's
    /// default is `/tmp/`; the pod rendering picks a volume of its own).
    pub dir: Option<String>,
    /// Every block goes to disk, not only reused ones.
    pub admit_all: bool,
}

impl DiskTier {
    /// What the tier's volume must hold: its capacity, and the copies a sidecar still
    /// has on disk while it moves them to the object store (no longer counted in the
    /// tier; at most the sidecar's 256 MiB of object writes in flight).
    pub fn volume_bytes(&self) -> u64 {
        self.bytes + (256 << 20)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectTier {
    pub bucket: String,
    pub bytes: u64,
    /// An S3-compatible server's URL (MinIO, moto); AWS's own when unset.
    pub endpoint: Option<String>,
    pub region: Option<String>,
}

/// A `DYN_KVBM_*` value the operator cannot use; says which and why.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("spec.services.{service}: {variable} {problem}")]
pub struct KvbmError {
    pub service: String,
    pub variable: String,
    pub problem: String,
}

impl Kvbm {
    /// The tiers `service` asks for in its env (the graph's `envs`, then the service's,
    /// then its main container's, the later winning as in the pod), or `None`.
    pub fn of(
        service: &str,
        graph_envs: Option<&[EnvVar]>,
        spec: &ComponentSpec,
    ) -> Result<Option<Self>, KvbmError> {
        let extra = spec.extra_pod_spec.as_ref();
        // `mainContainer` replaces a listed `main` container's env as a whole
        // (`reconcile::pods::main_container`).
        let main_env = extra
            .and_then(|e| e.main_container.as_ref()?.env.as_ref())
            .or_else(|| {
                extra?
                    .containers
                    .iter()
                    .flatten()
                    .find(|c| c.name == "main")?
                    .env
                    .as_ref()
            });
        let mut env = BTreeMap::new();
        for var in graph_envs
            .into_iter()
            .flatten()
            .chain(spec.envs.iter().flatten())
            .chain(main_env.into_iter().flatten())
            .filter(|v| v.name.starts_with("DYN_KVBM_") || v.name == OBJECT_CACHE_GB)
        {
            env.insert(var.name.as_str(), var);
        }
        Env { service, env }.plan()
    }

    /// The sidecar's flags: its disk tier in `disk_dir`, its object tier under
    /// `object_prefix` (see [`object_prefix`]).
    pub fn sidecar_args(&self, disk_dir: &str, object_prefix: &str) -> Vec<String> {
        let mut args = Vec::new();
        if self.host_bytes > 0 {
            args.extend(["--kv-host-bytes".into(), self.host_bytes.to_string()]);
        }
        if let Some(disk) = &self.disk {
            args.extend([
                "--kv-disk-dir".into(),
                disk_dir.into(),
                "--kv-disk-bytes".into(),
                disk.bytes.to_string(),
            ]);
            if disk.admit_all {
                // One use (the offload itself) lets every evicted block through.
                args.extend(["--kv-disk-min-reuse".into(), "1".into()]);
            }
        }
        if let Some(object) = &self.object {
            args.extend([
                "--kv-object-url".into(),
                format!("s3://{}/{object_prefix}", object.bucket),
                "--kv-object-bytes".into(),
                object.bytes.to_string(),
            ]);
        }
        args
    }

    /// The S3 client's settings from `DYN_KVBM_OBJECT_ENDPOINT` and `_REGION`, for the
    /// sidecar's env (over the service's own `AWS_*`).
    pub fn object_env(&self) -> Vec<(&'static str, String)> {
        let Some(object) = &self.object else {
            return Vec::new();
        };
        let mut env = Vec::new();
        if let Some(endpoint) = &object.endpoint {
            env.push((AWS_ENDPOINT_URL, endpoint.clone()));
            // object_store refuses plain HTTP unless told (MinIO and moto in a cluster).
            if endpoint.starts_with("http://") {
                env.push((AWS_ALLOW_HTTP, "true".into()));
            }
        }
        if let Some(region) = &object.region {
            env.push((AWS_REGION, region.clone()));
        }
        env
    }
}

/// What is wrong with the tiers each engine service of `spec` asks for (for `dynamo
/// validate`; the reconcile and `dynamo run` refuse the same through the wiring plan).
pub fn problems(spec: &DynamoGraphDeploymentSpec) -> Vec<KvbmError> {
    spec.services
        .iter()
        .filter(|(_, s)| matches!(s.role(), ServiceRole::Engine(_)))
        .filter_map(|(name, s)| Kvbm::of(name, spec.envs.as_deref(), s).err())
        .collect()
}

/// Where one service's blocks live in the bucket: `{scope}/{graph}/{service}`, `scope`
/// being the namespace on a cluster. Blocks are keyed by a model-salted hash, so the pods
/// of one service share them (a block one pod offloaded is a hit for the others), but
/// not across services: two services of one model may lay blocks out differently (tensor
/// parallelism, dtype), under the same hash.
pub fn object_prefix(scope: &str, graph: &str, service: &str) -> String {
    format!("{scope}/{graph}/{service}")
}

struct Env<'a> {
    service: &'a str,
    env: BTreeMap<&'a str, &'a EnvVar>,
}

impl Env<'_> {
    fn error(&self, variable: &str, problem: impl Into<String>) -> KvbmError {
        KvbmError {
            service: self.service.into(),
            variable: variable.into(),
            problem: problem.into(),
        }
    }

    /// The literal value, `None` when unset or empty (Dynamo reads both as unset).
    fn get(&self, name: &str) -> Result<Option<&str>, KvbmError> {
        let Some(var) = self.env.get(name) else {
            return Ok(None);
        };
        match (&var.value, &var.value_from) {
            (_, Some(_)) => Err(self.error(
                name,
                "uses valueFrom: the operator writes the sidecar's flags from it, so it must be a literal value",
            )),
            (Some(v), None) if !v.trim().is_empty() => Ok(Some(v.trim())),
            _ => Ok(None),
        }
    }

    /// Gigabytes (10^9 bytes, a decimal number) as bytes; 0 when unset.
    fn bytes(&self, name: &str) -> Result<u64, KvbmError> {
        let Some(value) = self.get(name)? else {
            return Ok(0);
        };
        let bytes = value.parse::<f64>().ok().map(|gb| gb * 1e9);
        match bytes {
            Some(b) if b.is_finite() && b >= 0.0 && b < u64::MAX as f64 => Ok(b.round() as u64),
            _ => Err(self.error(
                name,
                format!(
                    "is {value:?}, not a size: a number of gigabytes (10^9 bytes, as Dynamo counts them), e.g. 4 or 0.5"
                ),
            )),
        }
    }

    /// Dynamo's truthy and falsy spellings; false when unset.
    fn flag(&self, name: &str) -> Result<bool, KvbmError> {
        let Some(value) = self.get(name)? else {
            return Ok(false);
        };
        match value.to_ascii_lowercase().as_str() {
            "1" | "true" | "on" | "yes" => Ok(true),
            "0" | "false" | "off" | "no" => Ok(false),
            _ => Err(self.error(name, format!("is {value:?}, not true or false"))),
        }
    }

    fn plan(&self) -> Result<Option<Kvbm>, KvbmError> {
        for (counted, sized) in BLOCK_COUNTS {
            if self.get(counted)?.is_some() {
                return Err(self.error(
                    counted,
                    format!(
                        "counts blocks, whose size depends on the model and engine, which the operator does not know: set {sized} (gigabytes) instead"
                    ),
                ));
            }
        }
        let host_bytes = self.bytes(CPU_CACHE_GB)?;
        let disk_bytes = self.bytes(DISK_CACHE_GB)?;
        let dir = self.get(DISK_CACHE_DIR)?;
        if let Some(dir) = dir
            && !dir.starts_with('/')
        {
            return Err(self.error(DISK_CACHE_DIR, format!("is {dir:?}, not an absolute path")));
        }
        let admit_all = self.flag(DISABLE_DISK_OFFLOAD_FILTER)?;
        let disk = (disk_bytes > 0).then(|| DiskTier {
            bytes: disk_bytes,
            dir: dir.map(str::to_owned),
            admit_all,
        });
        let object = if self.flag(OBJECT_ENABLED)? {
            Some(self.object()?)
        } else {
            None
        };
        if host_bytes == 0 && disk.is_none() && object.is_none() {
            return Ok(None);
        }
        Ok(Some(Kvbm {
            host_bytes,
            disk,
            object,
        }))
    }

    fn object(&self) -> Result<ObjectTier, KvbmError> {
        let bucket = self.get(OBJECT_BUCKET)?.ok_or_else(|| {
            self.error(
                OBJECT_BUCKET,
                format!("is not set, and {OBJECT_ENABLED} is: name the bucket"),
            )
        })?;
        if !is_bucket_name(bucket) {
            return Err(self.error(
                OBJECT_BUCKET,
                format!(
                    "is {bucket:?}, not a bucket name (3 to 63 lower-case letters, digits, dots and hyphens)"
                ),
            ));
        }
        let size = [OBJECT_CACHE_GB, OBJECT_CACHE_GB_OLD]
            .into_iter()
            .find(|name| self.env.contains_key(name))
            .unwrap_or(OBJECT_CACHE_GB);
        let bytes = self.bytes(size)?;
        if bytes == 0 {
            return Err(self.error(
                size,
                format!(
                    "is not set, and {OBJECT_ENABLED} is: the object tier's capacity in gigabytes"
                ),
            ));
        }
        let endpoint = self.get(OBJECT_ENDPOINT)?;
        if let Some(url) = endpoint {
            let parsed = reqwest::Url::parse(url).ok();
            if !parsed.is_some_and(|u| matches!(u.scheme(), "http" | "https") && u.has_host()) {
                return Err(self.error(
                    OBJECT_ENDPOINT,
                    format!("is {url:?}, not an http:// or https:// URL"),
                ));
            }
        }
        Ok(ObjectTier {
            bucket: bucket.into(),
            bytes,
            endpoint: endpoint.map(str::to_owned),
            region: self.get(OBJECT_REGION)?.map(str::to_owned),
        })
    }
}

/// S3's bucket naming rules, the part every S3-compatible server shares.
fn is_bucket_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    (3..=63).contains(&name.len())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
        && edge(name.chars().next())
        && edge(name.chars().last())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn plan(envs: serde_json::Value) -> Result<Option<Kvbm>, KvbmError> {
        let spec: ComponentSpec =
            serde_json::from_value(json!({"componentType": "worker", "envs": envs})).unwrap();
        Kvbm::of("worker", None, &spec)
    }

    fn vars(pairs: &[(&str, &str)]) -> serde_json::Value {
        pairs
            .iter()
            .map(|(name, value)| json!({"name": name, "value": value}))
            .collect()
    }

    fn problem(pairs: &[(&str, &str)]) -> String {
        plan(vars(pairs)).unwrap_err().to_string()
    }

    #[test]
    fn no_tier_variable_means_no_plan() {
        assert_eq!(plan(json!([])), Ok(None));
        assert_eq!(plan(vars(&[("DYN_ROUTER_MODE", "kv")])), Ok(None));
        // Zero and empty sizes are Dynamo's "no tier"; a directory alone sizes nothing.
        assert_eq!(
            plan(vars(&[
                (CPU_CACHE_GB, "0"),
                (DISK_CACHE_GB, ""),
                (DISK_CACHE_DIR, "/kv")
            ])),
            Ok(None)
        );
    }

    #[test]
    fn gigabytes_are_decimal_and_every_tier_maps_to_its_flags() {
        let kvbm = plan(vars(&[
            (CPU_CACHE_GB, "4"),
            (DISK_CACHE_GB, "0.5"),
            (DISK_CACHE_DIR, "/mnt/nvme/kv"),
            (DISABLE_DISK_OFFLOAD_FILTER, "True"),
            (OBJECT_ENABLED, "1"),
            (OBJECT_BUCKET, "kv-blocks"),
            (OBJECT_CACHE_GB, "100"),
            (OBJECT_ENDPOINT, "http://minio.storage:9000"),
            (OBJECT_REGION, "eu-west-1"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(kvbm.host_bytes, 4_000_000_000);
        let disk = kvbm.disk.as_ref().unwrap();
        assert_eq!(
            (disk.bytes, disk.dir.as_deref(), disk.admit_all),
            (500_000_000, Some("/mnt/nvme/kv"), true)
        );
        assert_eq!(
            kvbm.sidecar_args("/mnt/nvme/kv", "ns/g/worker").join(" "),
            "--kv-host-bytes 4000000000 --kv-disk-dir /mnt/nvme/kv --kv-disk-bytes 500000000 \
             --kv-disk-min-reuse 1 --kv-object-url s3://kv-blocks/ns/g/worker \
             --kv-object-bytes 100000000000"
        );
        assert_eq!(
            kvbm.object_env(),
            [
                (AWS_ENDPOINT_URL, "http://minio.storage:9000".to_string()),
                (AWS_ALLOW_HTTP, "true".into()),
                (AWS_REGION, "eu-west-1".into()),
            ]
        );
    }

    #[test]
    fn the_object_size_keeps_its_first_name_and_the_new_one_wins() {
        let object_bytes = |size: &[(&'static str, &'static str)]| {
            let mut env = vec![(OBJECT_ENABLED, "1"), (OBJECT_BUCKET, "kv-blocks")];
            env.extend_from_slice(size);
            plan(vars(&env)).unwrap().unwrap().object.unwrap().bytes
        };
        assert_eq!(object_bytes(&[(OBJECT_CACHE_GB_OLD, "3")]), 3_000_000_000);
        let both = [(OBJECT_CACHE_GB, "5"), (OBJECT_CACHE_GB_OLD, "3")];
        assert_eq!(object_bytes(&both), 5_000_000_000);
        let e = plan(vars(&[
            (OBJECT_ENABLED, "1"),
            (OBJECT_BUCKET, "kv-blocks"),
            (OBJECT_CACHE_GB_OLD, "lots"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains(OBJECT_CACHE_GB_OLD), "{e}");
    }

    #[test]
    fn the_disk_filter_stays_unless_disabled_and_object_settings_need_the_switch() {
        let kvbm = plan(vars(&[
            (DISK_CACHE_GB, "2"),
            (DISABLE_DISK_OFFLOAD_FILTER, "false"),
            (OBJECT_BUCKET, "kv-blocks"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(kvbm.object, None);
        assert_eq!(
            kvbm.sidecar_args("/d", "p").join(" "),
            "--kv-disk-dir /d --kv-disk-bytes 2000000000"
        );
        assert!(kvbm.object_env().is_empty());
    }

    #[test]
    fn the_main_containers_env_wins_over_the_services_and_the_graphs() {
        let spec: ComponentSpec = serde_json::from_value(json!({
            "envs": vars(&[(CPU_CACHE_GB, "2")]),
            "extraPodSpec": {"mainContainer": {"env": vars(&[(CPU_CACHE_GB, "3")])}},
        }))
        .unwrap();
        let graph: Vec<EnvVar> =
            serde_json::from_value(vars(&[(CPU_CACHE_GB, "1"), (DISK_CACHE_GB, "5")])).unwrap();
        let kvbm = Kvbm::of("worker", Some(&graph), &spec).unwrap().unwrap();
        assert_eq!(kvbm.host_bytes, 3_000_000_000);
        assert_eq!(kvbm.disk.unwrap().bytes, 5_000_000_000);
    }

    #[test]
    fn bad_values_name_the_service_and_the_variable() {
        for (pairs, expected) in [
            (
                &[(CPU_CACHE_GB, "lots")][..],
                "spec.services.worker: DYN_KVBM_CPU_CACHE_GB is \"lots\", not a size: a number of gigabytes",
            ),
            (
                &[(DISK_CACHE_GB, "-1")],
                "spec.services.worker: DYN_KVBM_DISK_CACHE_GB is \"-1\", not a size",
            ),
            (&[(CPU_CACHE_GB, "inf")], "DYN_KVBM_CPU_CACHE_GB is \"inf\""),
            (
                &[(DISK_CACHE_GB, "1"), (DISK_CACHE_DIR, "kv")],
                "DYN_KVBM_DISK_CACHE_DIR is \"kv\", not an absolute path",
            ),
            (
                &[(DISK_CACHE_GB, "1"), (DISABLE_DISK_OFFLOAD_FILTER, "maybe")],
                "DYN_KVBM_DISABLE_DISK_OFFLOAD_FILTER is \"maybe\", not true or false",
            ),
            (
                &[(OBJECT_ENABLED, "true"), (OBJECT_CACHE_GB, "1")],
                "DYN_KVBM_OBJECT_BUCKET is not set, and DYN_KVBM_OBJECT_ENABLED is",
            ),
            (
                &[(OBJECT_ENABLED, "true"), (OBJECT_BUCKET, "KV_Blocks")],
                "DYN_KVBM_OBJECT_BUCKET is \"KV_Blocks\", not a bucket name",
            ),
            (
                &[(OBJECT_ENABLED, "true"), (OBJECT_BUCKET, "kv")],
                "not a bucket name",
            ),
            (
                &[(OBJECT_ENABLED, "true"), (OBJECT_BUCKET, "kv-blocks")],
                "DYNAMO_KVBM_OBJECT_CACHE_GB is not set, and DYN_KVBM_OBJECT_ENABLED is",
            ),
            (
                &[
                    (OBJECT_ENABLED, "yes"),
                    (OBJECT_BUCKET, "kv-blocks"),
                    (OBJECT_CACHE_GB, "1"),
                    (OBJECT_ENDPOINT, "minio:9000"),
                ],
                "DYN_KVBM_OBJECT_ENDPOINT is \"minio:9000\", not an http:// or https:// URL",
            ),
            (
                &[("DYN_KVBM_OBJECT_NUM_BLOCKS", "1000")],
                "DYN_KVBM_OBJECT_NUM_BLOCKS counts blocks, whose size depends on the model and engine, which the operator does not know: set DYNAMO_KVBM_OBJECT_CACHE_GB (gigabytes) instead",
            ),
            (
                &[("DYN_KVBM_CPU_CACHE_OVERRIDE_NUM_BLOCKS", "10")],
                "set DYN_KVBM_CPU_CACHE_GB",
            ),
        ] {
            let found = problem(pairs);
            assert!(found.contains(expected), "{pairs:?}: {found}");
        }
    }

    #[test]
    fn a_value_from_elsewhere_cannot_size_a_tier() {
        let err = plan(json!([{"name": CPU_CACHE_GB,
            "valueFrom": {"configMapKeyRef": {"name": "kv", "key": "gb"}}}]))
        .unwrap_err();
        assert_eq!(err.variable, CPU_CACHE_GB);
        assert!(err.problem.contains("must be a literal value"), "{err}");
    }
}
