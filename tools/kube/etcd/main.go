// Command etcd is upstream's etcd server (go.etcd.io/etcd/server/v3/etcdmain), built from the module
// proxy: etcd's own server module cannot be `go install`ed because of its replace directives.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
