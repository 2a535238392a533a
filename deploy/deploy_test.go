// Package deploy_test checks the shipped deployment files: the Kubernetes
// manifests decode strictly into the Kubernetes API types (an unknown or
// misspelt field fails), and every stage has what operating it needs. It is
// a module of its own so that k8s.io/api stays out of toolgate's.
package deploy_test

import (
	"os"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

func documents(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var docs []string
	for _, d := range strings.Split(string(b), "\n---\n") {
		if strings.TrimSpace(d) != "" {
			docs = append(docs, d)
		}
	}
	return docs
}

// TestKubernetesManifests: strict decoding, and per Deployment: probes on
// /healthz and /readyz, requests and a memory limit, Prometheus scrape
// annotations, a non-root security context, credentials from Secrets, and a
// PodDisruptionBudget selecting its pods.
func TestKubernetesManifests(t *testing.T) {
	var deps []appsv1.Deployment
	pdbs := map[string]policyv1.PodDisruptionBudget{}
	for _, d := range documents(t, "kubernetes/toolgate.yaml") {
		var meta struct{ Kind string }
		if err := yaml.Unmarshal([]byte(d), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "Deployment":
			var dep appsv1.Deployment
			if err := yaml.UnmarshalStrict([]byte(d), &dep); err != nil {
				t.Fatalf("deployment: %v\n%s", err, d)
			}
			deps = append(deps, dep)
		case "PodDisruptionBudget":
			var p policyv1.PodDisruptionBudget
			if err := yaml.UnmarshalStrict([]byte(d), &p); err != nil {
				t.Fatalf("pdb: %v", err)
			}
			pdbs[p.Spec.Selector.MatchLabels["stage"]] = p
		case "ConfigMap":
			var c corev1.ConfigMap
			if err := yaml.UnmarshalStrict([]byte(d), &c); err != nil {
				t.Fatalf("configmap: %v", err)
			}
		case "Job":
			// The topology is the operator's: the setup Job alone holds
			// operator credentials.
			var j batchv1.Job
			if err := yaml.UnmarshalStrict([]byte(d), &j); err != nil {
				t.Fatalf("job: %v", err)
			}
			c := j.Spec.Template.Spec.Containers[0]
			if len(c.Args) == 0 || c.Args[0] != "setup" {
				t.Errorf("job %s runs %v, want toolgate setup", j.Name, c.Args)
			}
			vs := j.Spec.Template.Spec.Volumes
			if len(vs) != 1 || vs[0].Secret == nil || vs[0].Secret.SecretName != "toolgate-nats-operator" {
				t.Errorf("job %s mounts %+v, want the operator's credentials", j.Name, vs)
			}
		default:
			t.Fatalf("unexpected kind %q", meta.Kind)
		}
	}
	var stages []string
	for _, dep := range deps {
		t.Run(dep.Name, func(t *testing.T) {
			stage := dep.Spec.Template.Labels["stage"]
			stages = append(stages, stage)
			if dep.Spec.Selector.MatchLabels["stage"] != stage {
				t.Errorf("selector %v does not select the template's labels", dep.Spec.Selector.MatchLabels)
			}
			a := dep.Spec.Template.Annotations
			if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != "9464" {
				t.Errorf("no Prometheus scrape annotations: %v", a)
			}
			if sc := dep.Spec.Template.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
				t.Error("pods may run as root")
			}
			c := dep.Spec.Template.Spec.Containers[0]
			if !slices.Contains(c.Args, "--metrics-addr") || c.Args[0] != "stage" || c.Args[1] != stage {
				t.Errorf("args %v: want stage %s with --metrics-addr", c.Args, stage)
			}
			if p := c.LivenessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" {
				t.Error("liveness probe is not /healthz")
			}
			if p := c.ReadinessProbe; p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/readyz" {
				t.Error("readiness probe is not /readyz")
			}
			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("resources %+v: want cpu and memory requests and a memory limit", c.Resources)
			}
			secrets := map[string]bool{}
			for _, v := range dep.Spec.Template.Spec.Volumes {
				if v.Secret != nil {
					secrets[v.Secret.SecretName] = true
				}
			}
			// The auth callout's pods hold the deployment's keys, the
			// roles' credentials among them; every other pod its own
			// role's credentials and no other's.
			var nats []string
			for s := range secrets {
				if strings.HasPrefix(s, "toolgate-nats-") {
					nats = append(nats, s)
				}
			}
			switch {
			case stage == "authcallout":
				if !secrets["toolgate-bus-keys"] || len(nats) > 0 {
					t.Errorf("the auth callout mounts %v, want the deployment's keys alone", nats)
				}
			case len(nats) != 1 || nats[0] != "toolgate-nats-"+stage:
				t.Errorf("mounts NATS credentials %v, want its own role's toolgate-nats-%s alone", nats, stage)
			}
			// Each signing role its own keys: its message-signing key,
			// hops.pub, and what its stage needs beside them (the sealing
			// key, the token key), from a Secret of its own.
			if stage != "authcallout" {
				var keys []string
				for s := range secrets {
					if strings.HasPrefix(s, "toolgate-keys-") {
						keys = append(keys, s)
					}
				}
				if len(keys) != 1 || keys[0] != "toolgate-keys-"+stage {
					t.Errorf("mounts keys %v, want its own role's toolgate-keys-%s alone", keys, stage)
				}
				if !slices.Contains(c.Args, "--data") {
					t.Errorf("args %v: no --data, where its keys are mounted", c.Args)
				}
			}
			if stage == "authorize" && !secrets["toolgate-jwks"] {
				t.Error("authorize: key set not from a Secret")
			}
			if stage == "execute" && !secrets["toolgate-tool-credentials"] {
				t.Error("execute: tool credentials not from a Secret")
			}
			if p, ok := pdbs[stage]; !ok || p.Spec.MinAvailable == nil {
				t.Errorf("no PodDisruptionBudget for stage %s", stage)
			}
		})
	}
	for _, want := range []string{"validate", "authorize", "route", "execute", "verify", "audit", "control"} {
		if !slices.Contains(stages, want) {
			t.Errorf("no Deployment for %s", want)
		}
	}
}

// TestNATSValues: the nats/nats chart values ask for a three-server cluster
// with JetStream on file storage.
func TestNATSValues(t *testing.T) {
	b, err := os.ReadFile("nats-values.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Config struct {
			Cluster struct {
				Enabled  bool `json:"enabled"`
				Replicas int  `json:"replicas"`
			} `json:"cluster"`
			JetStream struct {
				Enabled   bool `json:"enabled"`
				FileStore struct {
					Enabled bool `json:"enabled"`
				} `json:"fileStore"`
			} `json:"jetstream"`
		} `json:"config"`
	}
	if err := yaml.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	if !v.Config.Cluster.Enabled || v.Config.Cluster.Replicas != 3 || !v.Config.JetStream.Enabled || !v.Config.JetStream.FileStore.Enabled {
		t.Fatalf("values: %+v; want a 3-replica cluster with JetStream file storage", v.Config)
	}
}

// TestDockerfile: multi-stage, the bases build arguments defaulting to the
// public images (the Go one at go.mod's Go release), a slim Debian runtime
// with bubblewrap and util-linux, and a numeric non-root user.
func TestDockerfile(t *testing.T) {
	b, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	mod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	var goVersion string
	for _, l := range strings.Split(string(mod), "\n") {
		if v, ok := strings.CutPrefix(l, "go "); ok {
			goVersion = strings.Join(strings.Split(v, ".")[:2], ".")
		}
	}
	for _, want := range []string{
		"ARG GO_IMAGE=golang:" + goVersion + "-bookworm\n", "ARG BASE_IMAGE=debian:bookworm-slim\n",
		"FROM ${GO_IMAGE} AS build\n", "FROM ${BASE_IMAGE}\n",
		"ARG GOPROXY\n", "bubblewrap", "util-linux", "COPY --from=build", "USER 10001:10001\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("Dockerfile lacks %q", want)
		}
	}
}

// TestImageName: the Kubernetes manifests run the image `make image` tags,
// pulled only when the node does not have it.
func TestImageName(t *testing.T) {
	b, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var image string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "IMAGE ?= "); ok {
			image = strings.TrimSpace(v)
		}
	}
	if image == "" {
		t.Fatal("no IMAGE ?= in the Makefile")
	}
	n := 0
	for _, d := range documents(t, "kubernetes/toolgate.yaml") {
		var dep appsv1.Deployment
		if err := yaml.Unmarshal([]byte(d), &dep); err != nil {
			t.Fatal(err)
		}
		for _, c := range dep.Spec.Template.Spec.Containers {
			n++
			if c.Image != image {
				t.Errorf("%s/%s runs %q, make image tags %q", dep.Name, c.Name, c.Image, image)
			}
			// A :latest image loaded into the nodes (kind load) is used,
			// not pulled from a registry that never had it.
			if c.ImagePullPolicy != corev1.PullIfNotPresent {
				t.Errorf("%s/%s: imagePullPolicy %q, want IfNotPresent", dep.Name, c.Name, c.ImagePullPolicy)
			}
		}
	}
	if n == 0 {
		t.Fatal("no containers in the manifests")
	}
}

// TestSitesCompose: the sites example runs a hub that accepts leaf nodes
// and a site whose leaf node dials that port, with its bundle as its data
// directory (docs/sites.md).
func TestSitesCompose(t *testing.T) {
	b, err := os.ReadFile("sites/compose.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Services map[string]struct {
			Image   string   `json:"image"`
			Command []string `json:"command"`
			Ports   []string `json:"ports"`
			Volumes []string `json:"volumes"`
		} `json:"services"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	flag := func(args []string, name string) string {
		for _, a := range args {
			if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
				return v
			}
		}
		return ""
	}
	hub, site := c.Services["hub"], c.Services["lab-eu"]
	leaf := flag(hub.Command, "leaf-listen")
	if leaf == "" || !strings.Contains(strings.Join(hub.Ports, " "), "7422:7422") {
		t.Fatalf("the hub accepts no leaf nodes: %v %v", hub.Command, hub.Ports)
	}
	if flag(site.Command, "site") != "lab-eu" || flag(site.Command, "hub") != "nats-leaf://hub:"+strings.Split(leaf, ":")[1] {
		t.Errorf("the site does not dial the hub's leaf port: %v", site.Command)
	}
	if data := flag(site.Command, "data"); !strings.Contains(strings.Join(site.Volumes, " "), ":"+data+":ro") {
		t.Errorf("the site's data directory %s is not its mounted bundle: %v", data, site.Volumes)
	}
	if len(site.Ports) != 0 {
		t.Errorf("the site opens ports %v: its leaf node dials out", site.Ports)
	}
	for name, s := range c.Services {
		if s.Image != "toolgate:latest" || s.Command[0] != "serve" {
			t.Errorf("%s: %s %v", name, s.Image, s.Command)
		}
	}
}
