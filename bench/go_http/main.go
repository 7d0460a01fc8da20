// A Go net/http server answering every request with a static 200
// "ready\n": the stand-in for pilot-agent's status server (Go net/http)
// in bench/load.sh. Loopback only.
//
// Run: go run bench/go_http/main.go 127.0.0.1:PORT
package main

import (
	"log"
	"net"
	"net/http"
	"os"
)

func main() {
	addr := "127.0.0.1:18081"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || !net.ParseIP(host).IsLoopback() {
		log.Fatalf("loopback only: %q", addr)
	}
	body := []byte("ready\n")
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write(body)
	})
	log.Fatal(http.ListenAndServe(addr, nil))
}
