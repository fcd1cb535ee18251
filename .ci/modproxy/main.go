// Command modproxy writes a file-based GOPROXY holding modules of this
// tree at one version, as a release would publish them: for each module
// directory given, its go.mod, a .info and a module zip of the files git
// knows there (tracked or untracked but not ignored), without the files of
// nested modules. .ci/consumer.sh points a consumer at it with
// GOPROXY=file://DIR, so `go get` fetches these modules as a user would.
//
//	go run .ci/modproxy/main.go -version v0.1.0 -out DIR . replaydpg replaydprom
//
// It uses the standard library only, so it adds nothing to any go.mod.
package main

import (
	"archive/zip"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"time"
)

func main() {
	version := flag.String("version", "", "the version to publish the modules at, e.g. v0.1.0")
	out := flag.String("out", "", "the proxy directory to write")
	flag.Parse()
	if *version == "" || *out == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: modproxy -version vX.Y.Z -out DIR moduledir...")
		os.Exit(2)
	}
	for _, dir := range flag.Args() {
		mod, err := publish(dir, *version, *out)
		if err != nil {
			fmt.Fprintf(os.Stderr, "modproxy: %s: %v\n", dir, err)
			os.Exit(1)
		}
		fmt.Printf("%s@%s\n", mod, *version)
	}
}

// publish writes the module in dir at version into the proxy directory out
// and returns its path.
func publish(dir, version, out string) (string, error) {
	gomod, err := os.ReadFile(filepath.Join(dir, "go.mod"))
	if err != nil {
		return "", err
	}
	mod := modulePath(gomod)
	if mod == "" {
		return "", fmt.Errorf("go.mod has no module line")
	}
	files, err := moduleFiles(dir)
	if err != nil {
		return "", err
	}
	esc, err := escape(mod)
	if err != nil {
		return "", err
	}
	vdir := filepath.Join(out, filepath.FromSlash(esc), "@v")
	if err := os.MkdirAll(vdir, 0o755); err != nil {
		return "", err
	}
	var z bytes.Buffer
	zw := zip.NewWriter(&z)
	for _, name := range files {
		w, err := zw.Create(mod + "@" + version + "/" + name)
		if err != nil {
			return "", err
		}
		f, err := os.Open(filepath.Join(dir, filepath.FromSlash(name)))
		if err != nil {
			return "", err
		}
		_, err = io.Copy(w, f)
		f.Close()
		if err != nil {
			return "", err
		}
	}
	if err := zw.Close(); err != nil {
		return "", err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    time.Time
	}{version, time.Now().UTC().Truncate(time.Second)})
	if err != nil {
		return "", err
	}
	for name, data := range map[string][]byte{
		version + ".mod":  gomod,
		version + ".zip":  z.Bytes(),
		version + ".info": info,
		"list":            []byte(version + "\n"),
	} {
		if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
			return "", err
		}
	}
	return mod, nil
}

// moduleFiles lists, slash-separated and relative to dir, the files of the
// module rooted at dir: what git knows there, less every directory that
// holds a go.mod of its own (a nested module, published on its own) and
// files deleted from the work tree.
func moduleFiles(dir string) ([]string, error) {
	cmd := exec.Command("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", ".")
	cmd.Dir = dir
	cmd.Stderr = os.Stderr
	outb, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git ls-files: %v", err)
	}
	all := strings.Split(strings.TrimRight(string(outb), "\x00"), "\x00")
	nested := map[string]bool{}
	for _, name := range all {
		if d := path.Dir(name); path.Base(name) == "go.mod" && d != "." {
			nested[d] = true
		}
	}
	var files []string
	seen := map[string]bool{}
	for _, name := range all {
		if name == "" || seen[name] || inNested(name, nested) {
			continue
		}
		seen[name] = true
		if _, err := os.Lstat(filepath.Join(dir, filepath.FromSlash(name))); os.IsNotExist(err) {
			continue
		}
		files = append(files, name)
	}
	return files, nil
}

// inNested reports whether the file name lies under one of the nested
// module directories.
func inNested(name string, nested map[string]bool) bool {
	for d := path.Dir(name); d != "."; d = path.Dir(d) {
		if nested[d] {
			return true
		}
	}
	return false
}

// modulePath returns the path on the module line of a go.mod.
func modulePath(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`)
		}
	}
	return ""
}

// escape is a module path as a proxy stores it: each upper-case letter as
// '!' and its lower case.
func escape(mod string) (string, error) {
	var b strings.Builder
	for _, r := range mod {
		switch {
		case r == '!':
			return "", fmt.Errorf("module path %q holds '!'", mod)
		case 'A' <= r && r <= 'Z':
			b.WriteByte('!')
			b.WriteRune(r + 'a' - 'A')
		default:
			b.WriteRune(r)
		}
	}
	return b.String(), nil
}
