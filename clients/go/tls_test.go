package raftlock

// mTLS and etcd auth from the Go client: certificates made in the test
// (crypto/x509), members under mTLS on both ports, auth turned on with
// etcdctl as an operator would.

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

type certFiles struct{ cert, key string }

type testCerts struct {
	ca            string
	member, alice certFiles
}

// makeCerts writes a CA, a member certificate for 127.0.0.1 (server and
// client use) and a client certificate with CN "alice".
func makeCerts(t *testing.T) *testCerts {
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "raftlock Go client test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name string, der []byte, key *ecdsa.PrivateKey) certFiles {
		files := certFiles{cert: filepath.Join(dir, name+".pem"), key: filepath.Join(dir, name+".key")}
		os.WriteFile(files.cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
		if key != nil {
			keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
			os.WriteFile(files.key, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600)
		}
		return files
	}
	issue := func(serial int64, cn string, server bool) certFiles {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		template := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		if server {
			template.ExtKeyUsage = append(template.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
			template.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
			template.DNSNames = []string{"localhost"}
		}
		der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return write(cn, der, key)
	}
	return &testCerts{
		ca:     write("ca", caDER, nil).cert,
		member: issue(2, "member", true),
		alice:  issue(3, "alice", false),
	}
}

func (c *testCerts) memberFlags() []string {
	return []string{
		"--cert-file", c.member.cert, "--key-file", c.member.key,
		"--trusted-ca-file", c.ca, "--client-cert-auth", "true",
		"--peer-cert-file", c.member.cert, "--peer-key-file", c.member.key,
		"--peer-trusted-ca-file", c.ca, "--peer-client-cert-auth", "true",
	}
}

// clientConfig trusts the test CA and presents files' certificate.
func (c *testCerts) clientConfig(t *testing.T, files certFiles) *tls.Config {
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(c.ca)
	pool.AppendCertsFromPEM(caPEM)
	config := &tls.Config{RootCAs: pool}
	if files.cert != "" {
		cert, err := tls.LoadX509KeyPair(files.cert, files.key)
		if err != nil {
			t.Fatal(err)
		}
		config.Certificates = []tls.Certificate{cert}
	}
	return config
}

func TestMutualTLSAndEtcdAuth(t *testing.T) {
	certs := makeCerts(t)
	c := startClusterWith(t, certs)
	// With its certificate, a client locks as anywhere.
	client := c.client(t)
	l := lock(t, session(t, client, 10*time.Second), "tls", Try())
	if ok, err := l.Validate(bg); !ok || err != nil {
		t.Fatalf("validate over mTLS: %v %v", ok, err)
	}
	// Without one, the members refuse the connection.
	anonymous, err := Connect(bg, c.endpoints, WithTLS(certs.clientConfig(t, certFiles{})), WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer anonymous.Close()
	if _, err := anonymous.Describe(bg, "tls", 0); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a client without a certificate: %v", err)
	}

	// Auth on, as an operator turns it on.
	etcdctl := func(args ...string) {
		t.Helper()
		base := []string{"--endpoints=https://" + strings.Join(c.endpoints, ",https://"),
			"--cacert=" + certs.ca, "--cert=" + certs.alice.cert, "--key=" + certs.alice.key}
		cmd := exec.Command("etcdctl", append(base, args...)...)
		cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("etcdctl %v: %v\n%s", args, err, out)
		}
	}
	etcdctl("user", "add", "root", "--new-user-password=root-secret")
	etcdctl("auth", "enable")
	// The user and password give a token; the lock API answers to it.
	root := c.client(t, WithAuth("root", "root-secret"))
	held := lock(t, session(t, root, 10*time.Second), "tls-auth", Try())
	if d, err := root.Describe(bg, "tls-auth", 0); err != nil || len(d.Holders) != 1 || d.Holders[0].Token != held.Token() {
		t.Fatalf("describe with auth: %v %v", d, err)
	}
	// A wrong password is refused with etcd's error.
	_, err = Connect(bg, c.endpoints, append(c.opts, WithAuth("root", "wrong"))...)
	var e *Error
	if !errors.As(err, &e) || e.Code != codes.InvalidArgument || e.Message != "etcdserver: authentication failed, invalid user ID or password" {
		t.Fatalf("a wrong password: %v", err)
	}
	// Without a token, the certificate's CN is the user (as in etcd):
	// there is no user "alice", so she may not take a lease.
	_, err = client.Session(bg, 10*time.Second)
	if !errors.As(err, &e) || e.Code != codes.FailedPrecondition || e.Message != "etcdserver: user name not found" {
		t.Fatalf("alice, who is no user: %v", err)
	}
}
