//! GPUs on the test bed: kwok nodes with allocatable `nvidia.com/gpu`, GPU Feature Discovery's
//! labels and the usual GPU taint, made by the test and removed after it. The Check stage places
//! the layers by llama.cpp's rules before any download, the Deployment asks for exactly those
//! GPUs with exactly those flags, the real scheduler puts the pod on the node that has them, and
//! Place reports, in the scheduler's words, a second model wanting the same GPUs (and which pod
//! holds them), and in the kubelet's, an engine whose CUDA is newer than the node's driver and a
//! GPU with less free memory than the engine allocates. A MIG slice is placed by its profile's
//! memory, a time-sliced share by its part of the GPU, a GKE node without GFD by the memory of its
//! accelerator, an EKS or AKS node without GFD by its instance type's GPUs, an AMD GPU by the size AMD's labeller gives it in GiB, and a replica of two
//! shares is refused. A node whose replicas label is no count is left out, named with that
//! label in Check's message, and the scheduler keeps the pod off it.
//!
//! The GPUs are MiB, not GiB: the pipeline mirrors the model before it is placed, so the model is
//! the test bed's small one, and the GPUs are sized to it. The same decision at GiB sizes (a model
//! that fits 2x 24 GiB but not 1x 16 GiB) is a unit test of src/pipeline/check/gpu.rs.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::Api;
use kube::api::PostParams;
use modelserve::api::{ModelServe, ModelServeStatus};
use support::fake_hub::FakeHub;
use support::{Namespace, Operator, Testbed, condition, eventually, model_pod, start_mirror};

/// Nodes the test makes, deleted when it ends however it ends.
struct GpuNodes<'a> {
    tb: &'a Testbed,
    names: Vec<String>,
}

impl Drop for GpuNodes<'_> {
    fn drop(&mut self) {
        for n in &self.names {
            let _ = self.tb.kubectl(&["delete", "node", n, "--wait=false"]);
        }
    }
}

/// The label naming the test process that made a GPU node.
const OWNER: &str = "testbed.modelserve.dev/gpu-node-of";

/// Deletes GPU nodes an earlier run of this test made and could not remove (it was killed).
fn remove_orphans(tb: &Testbed) {
    let out = tb.kubectl_ok(&["get", "nodes", "-l", OWNER, "-o", "json"]);
    let list: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
    for node in list["items"].as_array().into_iter().flatten() {
        let name = node["metadata"]["name"].as_str().unwrap_or_default();
        let pid = node["metadata"]["labels"][OWNER]
            .as_str()
            .unwrap_or_default();
        if !name.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = tb.kubectl(&["delete", "node", name, "--wait=false"]);
        }
    }
}

/// Makes `node` on the test bed (a [`GpuNodes`] names it for removal).
fn apply_node(tb: &Testbed, node: &serde_json::Value) {
    let applied = tb.kubectl_stdin(&["apply", "-f", "-"], &node.to_string());
    assert!(applied.status.success(), "{applied:?}");
}

/// A kwok node with `gpus` GPUs of `mib` MiB each, CUDA driver `driver`, in pool `pool`, not
/// shared, as GFD labels that (the MIG node below has no such labels, as older GFDs write).
fn gpu_node(name: &str, pool: &str, gpus: u32, mib: u64, driver: u32) -> serde_json::Value {
    let mut node = whole_gpus(name, pool, gpus, mib, driver);
    node["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "1".into();
    node["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] = "none".into();
    for field in ["capacity", "allocatable"] {
        node["status"][field]["nvidia.com/gpu"] = gpus.to_string().into();
    }
    node
}

/// A kwok node whose `gpus` GPUs of `mib` MiB are cut into `slices` MIG slices of profile 1g.5gb,
/// `slice_mib` MiB each, as the device plugin's mixed strategy and GFD show them: the slices as
/// `nvidia.com/mig-1g.5gb`, their memory as `nvidia.com/mig-1g.5gb.memory`, beside the whole
/// GPUs' labels.
fn mig_node(
    name: &str,
    pool: &str,
    (gpus, mib): (u32, u64),
    (slices, slice_mib): (u32, u64),
) -> serde_json::Value {
    let mut node = whole_gpus(name, pool, gpus, mib, 12);
    node["metadata"]["labels"]["nvidia.com/mig-1g.5gb.count"] = slices.to_string().into();
    node["metadata"]["labels"]["nvidia.com/mig-1g.5gb.memory"] = slice_mib.to_string().into();
    node["spec"]["taints"][0]["key"] = "nvidia.com/mig-1g.5gb".into();
    for field in ["capacity", "allocatable"] {
        node["status"][field][MIG] = slices.to_string().into();
    }
    node
}

/// The resource of the MIG slices of `mig_node`.
const MIG: &str = "nvidia.com/mig-1g.5gb";

/// A kwok node whose one GPU of `mib` MiB the device plugin time-slices among `replicas` pods,
/// advertised under its own name ([`SHARED`], renameByDefault), as GFD labels it: the
/// replicas and the strategy under `nvidia.com/gpu`, the product without a -SHARED suffix.
fn shared_node(name: &str, pool: &str, mib: u64, replicas: u32) -> serde_json::Value {
    let mut node = whole_gpus(name, pool, 1, mib, 12);
    node["metadata"]["labels"]["nvidia.com/gpu.replicas"] = replicas.to_string().into();
    node["metadata"]["labels"]["nvidia.com/gpu.sharing-strategy"] = "time-slicing".into();
    for field in ["capacity", "allocatable"] {
        node["status"][field][SHARED] = replicas.to_string().into();
    }
    node
}

/// The resource of the time-sliced shares of `shared_node`.
const SHARED: &str = "nvidia.com/gpu.shared";

/// A kwok node as GKE makes one of a T4 with its own device plugin and no GFD: the accelerator
/// named in `cloud.google.com/gke-accelerator`, no label of its memory or driver.
fn gke_node(name: &str, pool: &str) -> serde_json::Value {
    let mut node = gpu_node(name, pool, 1, 0, 12);
    let labels = node["metadata"]["labels"].as_object_mut().unwrap();
    labels.retain(|k, _| !k.starts_with("nvidia.com/"));
    labels.insert(
        "cloud.google.com/gke-accelerator".into(),
        "nvidia-tesla-t4".into(),
    );
    node
}

/// A kwok node of instance type `instance` as EKS or AKS makes one with NVIDIA's device plugin
/// and no GFD: its type in `node.kubernetes.io/instance-type`, no label of its GPUs, and `host`
/// of CPUs and memory (the scheduler prefers the emptier node).
fn instance_node(
    name: &str,
    pool: &str,
    instance: &str,
    (cpu, memory): (&str, &str),
) -> serde_json::Value {
    let mut node = gke_node(name, pool);
    let labels = node["metadata"]["labels"].as_object_mut().unwrap();
    labels.remove("cloud.google.com/gke-accelerator");
    labels.insert("node.kubernetes.io/instance-type".into(), instance.into());
    for field in ["capacity", "allocatable"] {
        node["status"][field]["cpu"] = cpu.into();
        node["status"][field]["memory"] = memory.into();
    }
    node
}

/// A kwok node with `gpus` AMD GPUs as AMD's node labeller sizes them (`labels`: one size for
/// GPUs alike, one label per size where they differ), and `host` of CPUs and memory (the
/// scheduler prefers the emptier node).
fn amd_node(
    name: &str,
    pool: &str,
    gpus: u32,
    labels: &[(&str, &str)],
    (cpu, memory): (&str, &str),
) -> serde_json::Value {
    let mut node = whole_gpus(name, pool, gpus, 0, 0);
    let all = node["metadata"]["labels"].as_object_mut().unwrap();
    all.retain(|k, _| !k.starts_with("nvidia.com/"));
    all.insert("amd.com/gpu.product-name".into(), "AMD-TEST".into());
    for (k, v) in labels {
        all.insert((*k).into(), (*v).into());
    }
    node["spec"]["taints"][0]["key"] = "amd.com/gpu".into();
    for field in ["capacity", "allocatable"] {
        node["status"][field]["amd.com/gpu"] = gpus.to_string().into();
        node["status"][field]["cpu"] = cpu.into();
        node["status"][field]["memory"] = memory.into();
    }
    node
}

/// A kwok node with GFD's labels of `gpus` GPUs of `mib` MiB, and no GPU resource yet.
fn whole_gpus(name: &str, pool: &str, gpus: u32, mib: u64, driver: u32) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
            "labels": {
                OWNER: std::process::id().to_string(),
                "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", "type": pool,
                "nvidia.com/gpu.count": gpus.to_string(),
                "nvidia.com/gpu.memory": mib.to_string(),
                "nvidia.com/gpu.product": "NVIDIA-TEST",
                "nvidia.com/cuda.driver.major": driver.to_string(),
            },
        },
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "500Gi"},
            "allocatable": {"cpu": "16", "memory": "64Gi", "pods": "110", "ephemeral-storage": "500Gi"},
        },
    })
}

fn gpu_model(pool: &str, gpus: u32) -> serde_json::Value {
    serde_json::json!({
        "repo": "acme/TinyLlama-GGUF",
        "contextSize": 2048,
        "contextLength": 1024,
        "smokeTest": {"enabled": false},
        "engine": {"accelerator": "cuda", "gpus": gpus, "nodeSelector": {"type": pool}},
    })
}

/// A namespace `prefix-…` with its own operator, which keeps `headroom` of each GPU free, and its
/// ModelServes and pods; both last as long as the first two.
async fn checked_by<'a>(
    tb: &'a Testbed,
    prefix: &str,
    (hub, mirror): (&str, &str),
    headroom: &str,
) -> (Namespace<'a>, Operator, Api<ModelServe>, Api<Pod>) {
    let ns = tb.namespace(prefix);
    let args = ["--mirror-url", mirror, "--gpu-headroom", headroom];
    let op = Operator::start_with(tb, &ns.name, hub, &args);
    let api = Api::namespaced(tb.client().await, &ns.name);
    let pods = Api::namespaced(tb.client().await, &ns.name);
    (ns, op, api, pods)
}

/// A one-GPU model in a namespace whose pods the kwok fault stage of `prefix` fails
/// (testbed/kwok/pod-faults.yaml), checked by its own operator, once Placed is False with
/// `reason`: the Placed message, printed, and the status.
async fn faulted(
    tb: &Testbed,
    prefix: &str,
    (hub, mirror): (&str, &str),
    pool: &str,
    reason: &str,
) -> (String, ModelServeStatus) {
    let (_ns, _op, api, _) = checked_by(tb, prefix, (hub, mirror), "4Mi").await;
    let ms = ModelServe::new(prefix, serde_json::from_value(gpu_model(pool, 1)).unwrap());
    api.create(&PostParams::default(), &ms).await.unwrap();
    let s = until(&api, prefix, "Placed", ("False", reason), 240).await;
    let (_, _, m) = condition(&s, "Placed");
    println!("gpu: {prefix}: Placed False {reason}: {m}");
    (m, s)
}

async fn until(
    api: &Api<ModelServe>,
    name: &str,
    type_: &str,
    want: (&str, &str),
    secs: u64,
) -> ModelServeStatus {
    let got = eventually(Duration::from_secs(secs), async || {
        let s = api.get(name).await.ok()?.status?;
        let (st, reason, _) = condition(&s, type_);
        (st == want.0 && reason == want.1).then_some(s)
    })
    .await;
    match got {
        Some(s) => s,
        None => panic!(
            "{name}: {type_} never became {want:?}: {:#?}",
            api.get(name).await.ok().and_then(|m| m.status)
        ),
    }
}

/// The llama-server container of a replica's pod, and whether the pod tolerates the usual GPU
/// taint of `resource`.
fn server<'a>(spec: &'a PodSpec, resource: &str) -> (&'a Container, bool) {
    let server = spec
        .containers
        .iter()
        .find(|c| c.name == "llama-server")
        .unwrap();
    let tolerates = spec
        .tolerations
        .iter()
        .flatten()
        .any(|t| t.key.as_deref() == Some(resource));
    (server, tolerates)
}

/// A one-GPU model `name` of `pool` asking for `resource`, once Placed: it must be on `node`
/// alone, asking for one of `resource` and tolerating the usual GPU taint. Its status.check and
/// pod affinity (as JSON), printed.
async fn alone(
    api: &Api<ModelServe>,
    pods: &Api<Pod>,
    (name, pool): (&str, &str),
    (resource, node): (&str, &str),
) -> (modelserve::api::CheckStatus, String) {
    let mut spec = gpu_model(pool, 1);
    spec["engine"]["gpuResource"] = resource.into();
    let ms = ModelServe::new(name, serde_json::from_value(spec).unwrap());
    api.create(&PostParams::default(), &ms).await.unwrap();
    let s = until(api, name, "Placed", ("True", "Placed"), 240).await;
    let (_, _, checked) = condition(&s, "Checked");
    println!("gpu: {name}: Checked: {checked}");
    let pod = model_pod(pods, name).await;
    let spec = pod.spec.unwrap();
    assert_eq!(spec.node_name.as_deref(), Some(node), "{checked}");
    let (server, tolerates) = server(&spec, "nvidia.com/gpu");
    let limits = server.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits.get(resource).map(|q| q.0.as_str()), Some("1"));
    assert!(tolerates, "the usual GPU taint is tolerated");
    let affinity = serde_json::to_string(&spec.affinity).unwrap();
    println!("gpu: {name} placed on {node} with {resource} 1 and affinity {affinity}");
    (s.check.expect("status.check"), affinity)
}

/// AMD nodes whose GPUs are alike (one `amd.com/gpu.vram`) in pool `<pool>-amd`, and nodes whose
/// GPUs differ (a label per size) in pool `<pool>-amd-differ`; in each, a node with a 1G GPU
/// that is the emptier, which the scheduler would pick but for the affinity. A one-GPU ROCm model
/// in each pool, checked by an operator that keeps 768 MiB of each GPU free: a 1G GPU (at least
/// 0.5 GiB) holds nothing and a 2G one (1.5 GiB) the whole model. Each replica must go to the
/// node whose GPUs are all 2G or more, by its node affinity.
async fn amd_gpus(tb: &Testbed, (hub, mirror): (&str, &str), pool: &str) {
    let (alike, differ) = (format!("{pool}-amd"), format!("{pool}-amd-differ"));
    let name = |pool: &str, size: &str| format!("{pool}-{size}");
    let nodes = GpuNodes {
        tb,
        names: vec![
            name(&alike, "1g"),
            name(&alike, "2g"),
            name(&differ, "1g-4g"),
            name(&differ, "2g-4g"),
        ],
    };
    let (empty, busy) = (("64", "256Gi"), ("4", "3Gi"));
    let one = |size: &'static str| [("amd.com/gpu.vram", size)];
    for node in [
        amd_node(&nodes.names[0], &alike, 1, &one("1G"), empty),
        amd_node(&nodes.names[1], &alike, 1, &one("2G"), busy),
        amd_node(
            &nodes.names[2],
            &differ,
            2,
            &[("amd.com/gpu.vram.1G", "1"), ("amd.com/gpu.vram.4G", "1")],
            empty,
        ),
        amd_node(
            &nodes.names[3],
            &differ,
            2,
            &[("amd.com/gpu.vram.2G", "1"), ("amd.com/gpu.vram.4G", "1")],
            busy,
        ),
    ] {
        apply_node(tb, &node);
    }
    let (_ns, _op, api, pods) = checked_by(tb, "amd", (hub, mirror), "768Mi").await;
    let too_small = r#"{"key":"amd.com/gpu.vram","operator":"NotIn","values":["1G"]}"#;
    let placed = [
        ("rocm", &alike, &nodes.names[1], too_small),
        (
            "rocm-differ",
            &differ,
            &nodes.names[3],
            r#"{"key":"amd.com/gpu.vram.1G","operator":"DoesNotExist"}"#,
        ),
    ];
    for (model, pool, node, term) in placed {
        let mut spec = gpu_model(pool, 1);
        spec["engine"]["accelerator"] = "rocm".into();
        let ms = ModelServe::new(model, serde_json::from_value(spec).unwrap());
        api.create(&PostParams::default(), &ms).await.unwrap();
        let s = until(&api, model, "Placed", ("True", "Placed"), 240).await;
        let (_, _, checked) = condition(&s, "Checked");
        println!("gpu: {model}: Checked: {checked}");
        let check = s.check.clone().expect("status.check");
        assert_eq!(check.gpu_memory_bytes, Some(3 << 29), "{checked}");
        assert_eq!(check.gpu_layers, check.layers, "full offload: {checked}");
        let spec = model_pod(&pods, model).await.spec.unwrap();
        let affinity = serde_json::to_string(&spec.affinity).unwrap();
        println!(
            "gpu: {model} placed on {:?} with affinity {affinity}",
            spec.node_name
        );
        assert_eq!(spec.node_name.as_ref(), Some(node), "{affinity}");
        let (container, tolerates) = server(&spec, "amd.com/gpu");
        assert!(tolerates, "the usual GPU taint is tolerated");
        let limits = container.resources.as_ref().and_then(|r| r.limits.as_ref());
        let gpus = limits.and_then(|l| l.get("amd.com/gpu"));
        assert_eq!(gpus.map(|q| q.0.as_str()), Some("1"));
        assert!(affinity.contains(term), "{affinity}");
    }
    let s = api.get_status("rocm-differ").await.unwrap().status.unwrap();
    assert_eq!(s.check.unwrap().amd_mixed_sizes, ["2G"]);
    drop(nodes);
}

/// EKS and AKS nodes without GFD in pool `<pool>-cloud`: a g4dn (one T4, 15 GiB) that is the
/// emptier, a g5 (one A10G, 22.5 GiB), an Azure NC24ads A100 v4 (one A100, 80 GiB) that is the
/// busiest, and a g6f, whose fractional L4 modelserve does not size. A one-GPU model checked by
/// an operator that keeps 15 GiB of each GPU free, so that a T4 holds nothing: it must be planned
/// on the A10G's memory, say which types it assumed and why the g6f is left out, and go to the
/// g5 by its node affinity, which admits the A100 too.
async fn instance_type_gpus(tb: &Testbed, (hub, mirror): (&str, &str), pool: &str) {
    let pool = format!("{pool}-cloud");
    let nodes = GpuNodes {
        tb,
        names: ["g4dn", "g5", "g6f", "aks-a100"]
            .map(|t| format!("{pool}-{t}"))
            .to_vec(),
    };
    let (empty, busy) = (("64", "256Gi"), ("4", "3Gi"));
    let a100 = "Standard_NC24ads_A100_v4";
    let types = [
        ("g4dn.xlarge", empty),
        ("g5.xlarge", busy),
        ("g6f.large", empty),
        (a100, ("2", "1Gi")),
    ];
    for (name, (instance, host)) in nodes.names.iter().zip(types) {
        apply_node(tb, &instance_node(name, &pool, instance, host));
    }
    let (_ns, _op, api, pods) = checked_by(tb, "cloud", (hub, mirror), "15Gi").await;
    let on = ("nvidia.com/gpu", nodes.names[1].as_str());
    let (check, affinity) = alone(&api, &pods, ("eks", &pool), on).await;
    assert_eq!(check.gpu_memory_bytes, Some(23028 << 20));
    assert_eq!(check.gpu_layers, check.layers, "full offload: {check:#?}");
    assert_eq!(check.instance_types, [a100, "g5.xlarge"]);
    assert_eq!(check.devices[0].product.as_deref(), Some("NVIDIA-A10G"));
    let basis = check.basis.unwrap_or_default();
    assert!(
        basis.contains(&format!(
            "EC2 and Azure nodes that GPU Feature Discovery does not label are taken to have the \
             GPUs of their node.kubernetes.io/instance-type ({a100} NVIDIA-A100-80GB 80.0 GiB, \
             g5.xlarge NVIDIA-A10G 22.5 GiB)"
        )),
        "{basis}"
    );
    assert!(
        basis.contains(&format!(
            "left out ({}: node.kubernetes.io/instance-type=\"g6f.large\" is not an EC2 type \
             whose GPUs modelserve knows",
            nodes.names[2]
        )),
        "{basis}"
    );
    let term = format!(
        r#"{{"key":"node.kubernetes.io/instance-type","operator":"In","values":["{a100}","g5.xlarge"]}}"#
    );
    assert!(affinity.contains(&term), "{affinity}");
    drop(nodes);
}

#[tokio::test]
async fn gpu_models_are_placed_by_the_real_scheduler_with_the_computed_offload_and_failures_name_the_gpus()
 {
    let tb = Testbed::get();
    tb.install_crd();
    remove_orphans(&tb);
    let pool = format!("kwok-gpu-{}", std::process::id());
    let (one, two, spare, spare_too, mig, shared) = (
        format!("{pool}-one-small"),
        format!("{pool}-two-large"),
        format!("{pool}-spare"),
        format!("{pool}-spare-too"),
        format!("{pool}-mig"),
        format!("{pool}-shared"),
    );
    let unknown = format!("{pool}-unknown");
    let (gke_pool, gke) = (format!("{pool}-gke"), format!("{pool}-gke-t4"));
    let nodes = GpuNodes {
        tb: &tb,
        names: vec![
            one.clone(),
            two.clone(),
            spare.clone(),
            spare_too.clone(),
            mig.clone(),
            shared.clone(),
            unknown.clone(),
            gke.clone(),
        ],
    };
    // One GPU of 512 MiB cut into two slices of 64 MiB, one time-sliced four ways, and a node of
    // two whose replicas label is no count of pods, so that a GPU's share there is unknown.
    let mut unknown_node = gpu_node(&unknown, &pool, 2, 512, 12);
    unknown_node["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "many".into();
    for node in [
        mig_node(&mig, &pool, (1, 512), (2, 64)),
        shared_node(&shared, &pool, 512, 4),
        unknown_node,
        gke_node(&gke, &gke_pool),
    ] {
        apply_node(&tb, &node);
    }
    let sizes = [
        (&one, 1, 8),
        (&two, 2, 512),
        (&spare, 1, 512),
        (&spare_too, 1, 512),
    ];
    for (name, gpus, mib) in sizes {
        apply_node(&tb, &gpu_node(name, &pool, gpus, mib, 12));
    }
    let ns = tb.namespace("gpu");
    let hub = FakeHub::with_tiny_llama().await;
    let (mirror_url, _mirror) = start_mirror(&hub.url).await;
    let _op = Operator::start_with(
        &tb,
        &ns.name,
        &hub.url,
        &[
            "--mirror-url",
            &mirror_url,
            "--place-grace",
            "10s",
            "--gpu-headroom",
            "4Mi",
            "--engine-image-cuda",
            "ghcr.io/ggml-org/llama.cpp:server-cuda-b11312",
        ],
    );
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);

    // Two GPUs: only the two-GPU node has them; every layer goes to them, split in two.
    let ms = ModelServe::new(
        "first",
        serde_json::from_value(gpu_model(&pool, 2)).unwrap(),
    );
    api.create(&PostParams::default(), &ms).await.unwrap();
    let s = until(&api, "first", "Ready", ("True", "AllStagesDone"), 240).await;
    let check = s.check.clone().expect("status.check");
    let (_, _, checked) = condition(&s, "Checked");
    println!("gpu: Checked: {checked}");
    let layers = check.layers.expect("check.layers");
    assert_eq!(check.gpu_layers, Some(layers), "full offload: {checked}");
    assert_eq!(check.devices.len(), 2, "{check:#?}");
    assert_eq!(check.gpu_memory_bytes, Some(512 << 20));
    assert!(
        checked.contains(&format!(
            "left out ({unknown}: nvidia.com/gpu.replicas=\"many\" is not a count of the pods \
             that share a GPU, 0 to 1024)"
        )),
        "the node of unknown memory is named with why: {checked}"
    );
    for d in &check.devices {
        assert!(d.total_bytes + (4 << 20) <= d.memory_bytes, "{d:?}");
        println!(
            "gpu: device {}: layers {}, weights {} B, KV {} B, compute {} B, total {} B of {} B",
            d.index,
            d.layers,
            d.weights_bytes,
            d.kv_bytes,
            d.compute_bytes,
            d.total_bytes,
            d.memory_bytes
        );
    }
    let pods: Api<Pod> = Api::namespaced(tb.client().await, &ns.name);
    let pod = model_pod(&pods, "first").await;
    let spec = pod.spec.clone().unwrap();
    assert_eq!(
        spec.node_name.as_deref(),
        Some(two.as_str()),
        "the scheduler's choice"
    );
    let (server, tolerates) = server(&spec, "nvidia.com/gpu");
    assert!(tolerates, "the usual GPU taint is tolerated");
    let limits = server.resources.as_ref().unwrap().limits.as_ref().unwrap();
    assert_eq!(limits["nvidia.com/gpu"].0, "2");
    assert_eq!(
        limits["memory"].0,
        format!(
            "{}Mi",
            (check.memory_bytes.unwrap() as u64).div_ceil(1 << 20)
        ),
        "the memory request is the host's part alone"
    );
    let args = server.args.clone().unwrap();
    let after = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    };
    assert_eq!(after("--n-gpu-layers"), Some(layers.to_string()));
    assert_eq!(after("--split-mode").as_deref(), Some("layer"));
    assert_eq!(after("--tensor-split"), check.tensor_split.clone());
    assert_eq!(after("--fit").as_deref(), Some("off"));
    println!(
        "gpu: first placed on {two} with nvidia.com/gpu 2 and {:?}",
        &args[args.iter().position(|a| a == "--n-gpu-layers").unwrap()..]
    );

    // A second model wanting the same two GPUs: the scheduler's words, as InsufficientGPU.
    let ms = ModelServe::new(
        "second",
        serde_json::from_value(gpu_model(&pool, 2)).unwrap(),
    );
    api.create(&PostParams::default(), &ms).await.unwrap();
    let s = until(&api, "second", "Placed", ("False", "InsufficientGPU"), 180).await;
    let (_, _, m) = condition(&s, "Placed");
    println!("gpu: second: Placed False InsufficientGPU: {m}");
    assert!(m.contains("Insufficient nvidia.com/gpu"), "{m}");
    // And who holds them: the first model's pod, in this namespace.
    assert!(
        m.contains(&format!("{two}: 2 of 2 requested (2 by first-")),
        "{m}"
    );

    // A MIG slice: placed by its profile's memory, never the whole GPU's, on the node that has
    // slices, asking for one.
    let (check, affinity) = alone(&api, &pods, ("slice", &pool), (MIG, &mig)).await;
    assert_eq!(check.gpu_memory_bytes, Some(64 << 20));
    assert_eq!(
        check.devices[0].product.as_deref(),
        Some("NVIDIA-TEST-MIG-1g.5gb")
    );
    assert!(
        affinity.contains("nvidia.com/mig-1g.5gb.memory") && affinity.contains("\"63\""),
        "{affinity}"
    );

    // A GPU time-sliced four ways: a replica plans on a quarter of it, and goes only where a
    // GPU shared that way is at least four times that.
    let (check, affinity) = alone(&api, &pods, ("quarter", &pool), (SHARED, &shared)).await;
    assert_eq!(check.gpu_memory_bytes, Some(128 << 20));
    assert_eq!(check.gpu_shared_by, [4]);
    assert!(
        affinity.contains("\"nvidia.com/gpu.replicas\"") && affinity.contains("\"511\""),
        "{affinity}"
    );
    // A GKE node without GFD: sized by its accelerator, which Check's message says it assumed,
    // and the replica's affinity admits by name.
    let (check, affinity) = alone(&api, &pods, ("gke", &gke_pool), ("nvidia.com/gpu", &gke)).await;
    assert_eq!(check.gpu_memory_bytes, Some(15360 << 20));
    assert_eq!(check.gke_accelerators, ["nvidia-tesla-t4"]);
    assert_eq!(check.devices[0].product.as_deref(), Some("nvidia-tesla-t4"));
    assert!(
        check.basis.as_deref().is_some_and(|b| b.contains(
            "memory of their cloud.google.com/gke-accelerator (nvidia-tesla-t4 15.0 GiB)"
        )),
        "{check:#?}"
    );
    assert!(
        affinity.contains("\"cloud.google.com/gke-accelerator\"")
            && affinity.contains("\"nvidia-tesla-t4\""),
        "{affinity}"
    );
    // AMD's GPUs, labelled in GiB.
    amd_gpus(&tb, (&hub.url, &mirror_url), &pool).await;
    // EKS and AKS nodes without GFD, sized by their instance type.
    instance_type_gpus(&tb, (&hub.url, &mirror_url), &pool).await;
    // Two of those shares may be one GPU: a replica of two GPUs is refused there, saying why.
    let mut spec = gpu_model(&pool, 2);
    spec["engine"]["gpuResource"] = SHARED.into();
    let ms = ModelServe::new("pair", serde_json::from_value(spec).unwrap());
    api.create(&PostParams::default(), &ms).await.unwrap();
    let s = until(&api, "pair", "Checked", ("False", "NoNodeFits"), 120).await;
    let (_, _, m) = condition(&s, "Checked");
    println!("gpu: pair: Checked False NoNodeFits: {m}");
    assert!(
        m.contains(&format!("({shared}: nvidia.com/gpu.replicas=4)"))
            && m.contains("set engine.gpus to 1"),
        "{m}"
    );

    // An engine whose CUDA is newer than the node's driver, as a kwok fault plays it.
    let (m, _) = faulted(
        &tb,
        "fault-driver",
        (&hub.url, &mirror_url),
        &pool,
        "DriverTooOld",
    )
    .await;
    assert!(m.contains("CUDA driver version is insufficient"), "{m}");
    assert!(m.contains("server-cuda"), "it says what to do: {m}");

    // A GPU with less free memory than its label says, as a kwok fault plays it: the end of the
    // engine's log (its termination message), and what the Check stage planned on that GPU.
    let (m, s) = faulted(
        &tb,
        "fault-gpuoom",
        (&hub.url, &mirror_url),
        &pool,
        "GPUOutOfMemory",
    )
    .await;
    assert!(m.contains("cudaMalloc failed: out of memory | "), "{m}");
    assert!(
        !m.contains("0.00.121.310 E "),
        "llama.cpp's prefixes are dropped: {m}"
    );
    let planned = s.check.as_ref().and_then(|c| c.devices.first()).unwrap();
    let size = |b: i64| modelserve::units::human_bytes(b as u64);
    assert!(
        m.contains(&format!(
            "the Check stage planned {} of its {} on GPU 0",
            size(planned.total_bytes),
            size(planned.memory_bytes)
        )),
        "{m}"
    );
    assert!(m.contains("engine.gpuMemory"), "it says what to do: {m}");
    drop(nodes);
}
