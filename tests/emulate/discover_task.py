"""Run on every host of an emulated cluster: each task serves; the chief discovers the cluster (as
`tag-tf topology show --cluster tf_config` does) and prints one JSON line, then tells the others
to stop through a file (the hosts share this machine's file system)."""
import json
import os
import sys

from task_done import finish, wait

from tag_tf.measure.links import discover
from tag_tf.runtime import roles
from tag_tf.runtime.cluster import check_trusted

done_file = sys.argv[1]
role = roles.from_tf_config()
server = roles.start_server(role)
if role.is_chief:
    roles.wait_for_tasks(role)
    check_trusted(role.spec, False)
    topo, report = discover(role.spec, cache_dir=os.environ.get("TAG_TF_CACHE_DIR"))
    print(json.dumps({"topology": topo.to_dict(), "speeds": report["speeds"], "copy": report["links"]["copy"],
                      "pairs": [{"tasks": p["tasks"], "bandwidth": p["bandwidth"]} for p in report["links"]["pairs"]],
                      "cached": report["cached"]}), flush=True)
    finish(done_file)
else:
    wait(done_file)
