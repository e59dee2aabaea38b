package status

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
)

// Listener is where the status API listens. The API shows every managed
// job, where it runs and why, so it stays on this machine unless an
// operator asks otherwise: an address beyond loopback needs TLS, or an
// explicit opt-in to plain HTTP.
type Listener struct {
	// Address is host:port.
	Address string
	// CertFile and KeyFile turn on TLS (PEM files).
	CertFile, KeyFile string
	// AllowInsecure serves plain HTTP on an address beyond loopback.
	AllowInsecure bool
	// ClientCA is a PEM bundle: client certificates it signed are
	// verified in the handshake (mutual TLS; Auth.ClientCerts lets their
	// holders in). RequireClientCert refuses a handshake without one:
	// set when client certificates are the only way in.
	ClientCA          string
	RequireClientCert bool
}

// TLS reports whether the listener serves HTTPS.
func (l Listener) TLS() bool { return l.CertFile != "" }

// Scheme is "https" or "http".
func (l Listener) Scheme() string {
	if l.TLS() {
		return "https"
	}
	return "http"
}

// ErrInsecure is returned (wrapped) for plain HTTP beyond loopback
// without the opt-in.
var ErrInsecure = errors.New("plain HTTP beyond loopback")

// Check validates the listener without opening it.
func (l Listener) Check() error {
	host, port, err := net.SplitHostPort(l.Address)
	if err != nil {
		return fmt.Errorf("status API: http.address = %q: want host:port, e.g. \"127.0.0.1:4650\": %w", l.Address, err)
	}
	if port == "" {
		return fmt.Errorf("status API: http.address = %q: want a port, e.g. \"127.0.0.1:4650\"", l.Address)
	}
	if (l.CertFile == "") != (l.KeyFile == "") {
		return fmt.Errorf("status API: TLS needs both http.tls_cert and http.tls_key (-http-tls-cert, -http-tls-key); got cert %q, key %q", l.CertFile, l.KeyFile)
	}
	if l.ClientCA != "" && !l.TLS() {
		return fmt.Errorf("status API: http.client_ca = %q needs TLS: give http.tls_cert and http.tls_key too (client certificates are checked in the TLS handshake)", l.ClientCA)
	}
	if l.TLS() || l.AllowInsecure || loopbackHost(host) {
		return nil
	}
	return fmt.Errorf("status API: http.address = %q listens beyond this machine: %w; give the http block tls_cert and tls_key (flags -http-tls-cert, -http-tls-key), "+
		"or set allow_insecure_http = true (-http-allow-insecure) to serve every job's state unencrypted to the network anyway", l.Address, ErrInsecure)
}

// loopbackHost reports whether host names only this machine: "localhost"
// or a loopback IP. An empty host or 0.0.0.0 listens everywhere; any other
// name might resolve anywhere.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Listen checks the listener and opens it.
func (l Listener) Listen() (net.Listener, error) {
	if err := l.Check(); err != nil {
		return nil, err
	}
	var cfg *tls.Config
	if l.TLS() {
		cert, err := tls.LoadX509KeyPair(l.CertFile, l.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("status API: loading the TLS certificate %s and key %s: %w", l.CertFile, l.KeyFile, err)
		}
		cfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
		if l.ClientCA != "" {
			pem, err := os.ReadFile(l.ClientCA)
			if err != nil {
				return nil, fmt.Errorf("status API: http.client_ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("status API: http.client_ca %s holds no PEM certificate", l.ClientCA)
			}
			cfg.ClientCAs = pool
			cfg.ClientAuth = tls.VerifyClientCertIfGiven
			if l.RequireClientCert {
				cfg.ClientAuth = tls.RequireAndVerifyClientCert
			}
		}
	}
	ln, err := net.Listen("tcp", l.Address)
	if err != nil {
		return nil, fmt.Errorf("status API: %w", err)
	}
	// "localhost" is trusted only as far as it resolves: plain HTTP must
	// really be bound to loopback.
	if !l.TLS() && !l.AllowInsecure {
		if a, ok := ln.Addr().(*net.TCPAddr); !ok || !a.IP.IsLoopback() {
			ln.Close()
			return nil, fmt.Errorf("status API: http.address = %q bound %s, not a loopback address: %w; use an IP address such as 127.0.0.1", l.Address, ln.Addr(), ErrInsecure)
		}
	}
	if cfg != nil {
		ln = tls.NewListener(ln, cfg)
	}
	return ln, nil
}
