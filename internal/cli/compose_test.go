package cli_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestComposeFile checks docker-compose.yml against the binary: it parses,
// the relay services run commands and flags the binary has, their RELAY_*
// variables name real flags, and the ports they publish are the ones their
// flags listen on.
func TestComposeFile(t *testing.T) {
	t.Parallel()
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Build       any               `yaml:"build"`
			Image       string            `yaml:"image"`
			Command     []string          `yaml:"command"`
			Environment map[string]string `yaml:"environment"`
			Ports       []string          `yaml:"ports"`
			DependsOn   map[string]any    `yaml:"depends_on"`
			Healthcheck *struct {
				Test    []string `yaml:"test"`
				Disable bool     `yaml:"disable"`
			} `yaml:"healthcheck"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatalf("docker-compose.yml does not parse: %v", err)
	}
	if len(compose.Services) == 0 {
		t.Fatal("no services")
	}
	relayServices := 0
	for name, svc := range compose.Services {
		for dep := range svc.DependsOn {
			if _, ok := compose.Services[dep]; !ok {
				t.Errorf("%s depends on unknown service %s", name, dep)
			}
		}
		if svc.Build == nil {
			if svc.Image == "" {
				t.Errorf("%s has neither build nor image", name)
			}
			continue
		}
		relayServices++
		if len(svc.Command) == 0 {
			t.Fatalf("%s: no command", name)
		}
		// The subcommand path: leading words before the first flag.
		var path []string
		for _, w := range svc.Command {
			if strings.HasPrefix(w, "-") {
				break
			}
			path = append(path, w)
		}
		help := relay(t, nil, append(path, "-h")...)
		if help.Code != 0 || !strings.Contains(help.Stderr, "Usage of relay "+strings.Join(path, " ")) {
			t.Fatalf("%s: `relay %s` is not a command of the binary (exit %d): %s", name, strings.Join(path, " "), help.Code, help.Stderr)
		}
		flags := map[string]string{}
		for i, w := range svc.Command {
			if strings.HasPrefix(w, "--") {
				flag := strings.TrimPrefix(w, "--")
				if !strings.Contains(help.Stderr, "  -"+flag+" ") && !strings.Contains(help.Stderr, "  -"+flag+"\n") {
					t.Errorf("%s: relay %s has no flag --%s", name, strings.Join(path, " "), flag)
				}
				if i+1 < len(svc.Command) {
					flags[flag] = svc.Command[i+1]
				}
			}
		}
		for env := range svc.Environment {
			flag := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(env, "RELAY_"), "_", "-"))
			if !strings.HasPrefix(env, "RELAY_") || !strings.Contains(help.Stderr, "  -"+flag) {
				t.Errorf("%s: environment %s names no flag of relay %s", name, env, strings.Join(path, " "))
			}
		}
		// The image's HEALTHCHECK asks 127.0.0.1:9464 (the Dockerfile's
		// --http-addr); a daemon serving elsewhere needs its own check, and
		// a one-shot command none.
		switch hc := svc.Healthcheck; {
		case path[0] != "run":
			if hc == nil || !hc.Disable {
				t.Errorf("%s: a one-shot command; disable the image's health check", name)
			}
		case hc == nil:
			if !strings.HasSuffix(flags["http-addr"], ":9464") {
				t.Errorf("%s: --http-addr %q, but the image's health check asks port 9464", name, flags["http-addr"])
			}
		default:
			want := []string{"CMD", "/usr/local/bin/relay", "healthcheck", "--url", "http://127.0.0.1:" + flags["http-addr"][strings.LastIndex(flags["http-addr"], ":")+1:] + "/healthz"}
			if strings.Join(hc.Test, " ") != strings.Join(want, " ") {
				t.Errorf("%s: healthcheck %q, want %q", name, hc.Test, want)
			}
		}
		for _, port := range svc.Ports {
			container := port[strings.LastIndex(port, ":")+1:]
			found := false
			for _, flag := range []string{"http-addr", "kafka-addr"} {
				if strings.HasSuffix(flags[flag], ":"+container) {
					found = true
				}
			}
			if !found {
				t.Errorf("%s publishes port %s but no listener flag uses it (%v)", name, container, flags)
			}
		}
	}
	if relayServices < 3 {
		t.Fatalf("found %d relay services, want migrate, relay and the Kafka profile's", relayServices)
	}
}
