package busauth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"
)

// TestDeployConfigs loads the shipped server configurations with a
// generated auth.conf (and, for the cluster, generated certificates) and
// checks that they leave no anonymous access and enforce route TLS.
func TestDeployConfigs(t *testing.T) {
	dir := t.TempDir()
	if err := WriteTenants(dir, []string{"acme"}); err != nil {
		t.Fatal(err)
	}
	k, err := WriteCredentials(dir)
	if err != nil {
		t.Fatal(err)
	}
	auth, err := os.ReadFile(filepath.Join(dir, DirName, AuthConfFile))
	if err != nil {
		t.Fatal(err)
	}
	certs := t.TempDir()
	writeTestCerts(t, certs)
	for _, conf := range []string{"single/nats.conf", "cluster/nats-1.conf", "cluster/nats-2.conf", "cluster/nats-3.conf"} {
		t.Run(conf, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("..", "..", "deploy", conf))
			if err != nil {
				t.Fatal(err)
			}
			text := strings.ReplaceAll(string(src), "/etc/toolgate/tls/", certs+"/")
			text = strings.NewReplacer("node-1", "node", "node-2", "node", "node-3", "node").Replace(text)
			work := t.TempDir()
			os.WriteFile(filepath.Join(work, AuthConfFile), auth, 0o600)
			path := filepath.Join(work, "nats.conf")
			os.WriteFile(path, []byte(text), 0o600)
			o, err := server.ProcessConfigFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if o.AuthCallout == nil || o.AuthCallout.Issuer != k.Public().Issuer || o.AuthCallout.Account != AccountAuth {
				t.Fatalf("auth callout %+v", o.AuthCallout)
			}
			if !slices.ContainsFunc(o.Accounts, func(a *server.Account) bool { return a.Name == TenantAccount("acme") }) {
				t.Errorf("no account for the declared tenant acme")
			}
			if o.NoAuthUser != "" || o.Username != "" || o.Authorization != "" || len(o.Users) != 0 {
				t.Errorf("anonymous or static access: no_auth_user=%q user=%q users=%d", o.NoAuthUser, o.Username, len(o.Users))
			}
			if strings.HasPrefix(conf, "cluster/") {
				if o.Cluster.TLSConfig == nil || o.Cluster.TLSConfig.ClientAuth != tls.RequireAndVerifyClientCert {
					t.Error("cluster routes without verified TLS")
				}
			}
		})
	}
}

// writeTestCerts writes ca.pem, node.pem and node-key.pem for 127.0.0.1.
func writeTestCerts(t *testing.T, dir string) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "toolgate test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "toolgate-node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		KeyUsage:    x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	for name, blk := range map[string]*pem.Block{
		"ca.pem":       {Type: "CERTIFICATE", Bytes: caDER},
		"node.pem":     {Type: "CERTIFICATE", Bytes: der},
		"node-key.pem": {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(blk), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKubernetesMountsCredentials: every toolgate Deployment connects with
// credentials mounted from a Secret (NATS_CREDS, which --creds defaults to),
// and only the auth callout's pods hold the deployment's keys.
func TestKubernetesMountsCredentials(t *testing.T) {
	f, err := os.Open(filepath.Join("..", "..", "deploy", "kubernetes", "toolgate.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// The recipe at the top makes each role's keys Secret with what its
	// stage needs beside its own key and hops.pub.
	text, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`validate)  extra="--from-file=` + TokenKeyFile + `"`,
		`authorize) extra="--from-file=` + TokenKeyFile + ` --from-file=` + SealKeyFile + `"`,
		`execute)   extra="--from-file=` + SealPublicFile + `"`,
		`audit)     extra="--from-file=` + AuditChainKeyFile + ` --from-file=` + SealPublicFile + `"`,
		`--from-file=$r` + hopKeySuffix + ` --from-file=` + HopKeysFile,
	} {
		if !strings.Contains(string(text), want) {
			t.Errorf("the manifest's recipe lacks %s", want)
		}
	}
	type volume struct {
		Name   string `yaml:"name"`
		Secret *struct {
			SecretName string `yaml:"secretName"`
		} `yaml:"secret"`
	}
	type doc struct {
		Kind     string                `yaml:"kind"`
		Metadata struct{ Name string } `yaml:"metadata"`
		Data     map[string]string     `yaml:"data"`
		Spec     struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Env []struct {
							Name  string `yaml:"name"`
							Value string `yaml:"value"`
						} `yaml:"env"`
						VolumeMounts []struct {
							Name      string `yaml:"name"`
							MountPath string `yaml:"mountPath"`
						} `yaml:"volumeMounts"`
					} `yaml:"containers"`
					Volumes []volume `yaml:"volumes"`
				} `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	dec := yaml.NewDecoder(f)
	var docs []doc
	for {
		var d doc
		if err := dec.Decode(&d); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			t.Fatal(err)
		}
		docs = append(docs, d)
	}
	n, jobs := 0, 0
	for _, d := range docs {
		if d.Kind == "Job" {
			jobs++
		}
		if d.Kind == "ConfigMap" && d.Data["NATS_CREDS"] != "" {
			t.Errorf("the ConfigMap gives every pod the credentials %s: each role mounts its own", d.Data["NATS_CREDS"])
		}
		if d.Kind != "Deployment" {
			continue
		}
		n++
		t.Run(d.Metadata.Name, func(t *testing.T) {
			c := d.Spec.Template.Spec.Containers[0]
			creds := ""
			for _, e := range c.Env {
				if e.Name == "NATS_CREDS" {
					creds = e.Value
				}
			}
			secrets := map[string]string{}
			for _, v := range d.Spec.Template.Spec.Volumes {
				if v.Secret != nil {
					secrets[v.Name] = v.Secret.SecretName
				}
			}
			mounted := ""
			seals := map[string]bool{}
			for _, m := range c.VolumeMounts {
				if strings.HasPrefix(creds, strings.TrimSuffix(m.MountPath, "/")+"/") {
					mounted = secrets[m.Name]
				}
				if secrets[m.Name] == "toolgate-bus-keys" && d.Metadata.Name != "toolgate-authcallout" {
					t.Errorf("mounts the deployment's bus keys")
				}
				seals[secrets[m.Name]] = m.MountPath == "/var/lib/toolgate/"+DirName
			}
			// Every signing role mounts its own keys (its message-signing
			// key, hops.pub, and for authorize and execute the sealing key,
			// for validate and authorize the token key) at <--data>/busauth.
			if r := Role(strings.TrimPrefix(d.Metadata.Name, "toolgate-")); slices.Contains(SigningRoles, r) {
				if want := "toolgate-keys-" + string(r); !seals[want] {
					t.Errorf("does not mount %s at /var/lib/toolgate/%s: it would not start on an authenticated bus", want, DirName)
				}
				for k := range seals {
					if strings.HasPrefix(k, "toolgate-keys-") && k != "toolgate-keys-"+string(r) {
						t.Errorf("mounts another role's keys %s", k)
					}
				}
			}
			role := Role(strings.TrimPrefix(d.Metadata.Name, "toolgate-"))
			if role == "authcallout" {
				role = RoleControl // refusals are audited, revocations followed, as control
			}
			if !strings.HasSuffix(creds, "/"+CredsFile(role)) {
				t.Errorf("connects with %s, not its own role's %s", creds, CredsFile(role))
			}
			if mounted == "" {
				t.Errorf("credentials %s are not mounted from a Secret", creds)
			}
		})
	}
	if n < 8 {
		t.Fatalf("%d Deployments, want the six stages, control and the auth callout", n)
	}
	if jobs != 1 {
		t.Fatalf("%d Jobs, want the topology setup", jobs)
	}
}
