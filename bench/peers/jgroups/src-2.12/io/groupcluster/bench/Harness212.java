package io.groupcluster.bench;

import java.io.File;
import org.jgroups.JChannel;
import org.jgroups.Message;
import org.jgroups.ReceiverAdapter;
import org.jgroups.View;

/**
 * JGroups 2.12 member of the peer benchmark, the same logic as Harness (JGroups 5) through the 2.12 API
 * (Message is a class, ReceiverAdapter, no batch callback). Compiled with Core.java against Debian's
 * libjgroups-java.
 */
public final class Harness212 extends ReceiverAdapter {
    private final Core core;

    private Harness212(Core core) {
        this.core = core;
    }

    @Override
    public void receive(Message msg) {
        core.deliver(msg.getRawBuffer(), msg.getOffset(), msg.getLength(), System.nanoTime());
    }

    @Override
    public void viewAccepted(View view) {
        core.viewSize(view.size());
    }

    public static void main(String[] args) throws Exception {
        String[] rest = java.util.Arrays.copyOfRange(args, 2, args.length);
        Core core = Core.parse(rest);
        JChannel ch = new JChannel(new File(args[0]));
        ch.setReceiver(new Harness212(core));
        ch.connect(args[1]);
        core.viewSize(ch.getView().size());
        int code = core.run(payload -> ch.send(new Message(null, null, payload)));
        if (code != 0) System.exit(code);
        Core.park();
    }
}
